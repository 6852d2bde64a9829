"""Multi-turn recall: facts stated early in a chat, asked for turns later.

A conversation states ``facts`` facts (``My locker code is 5821.``), chats through
``filler_turns`` unrelated turns, then asks for each fact in turn. Probe j of a conversation is
the conversation so far -- including the questions before it, answered correctly by the assistant
-- plus question j, so each probe's messages extend the previous probe's: the earlier turns are the
shared, cached prefix.
"""

from __future__ import annotations

from probes.probe import Probe
from probes.seeding import settings_tag, stable_rng
from probes.text import Message

__all__ = ["FACTS", "generate"]

SYSTEM = ("You are a personal assistant with a perfect memory. The user will tell you facts about "
          "themselves; when asked for one later, reply with exactly the value they told you.")
# (what the fact is, how many digits its value has)
FACTS = (("locker code", 4), ("room number", 3), ("PIN", 4), ("ticket number", 6), ("parking spot", 3),
         ("badge number", 5), ("table number", 2), ("order number", 7))
TOPICS = ("tidal pools", "bread baking", "lighthouses", "chess openings", "migrating geese", "old maps")


def generate(seed: int, count: int, *, facts: int = 3, filler_turns: int = 2) -> tuple[Probe, ...]:
    """``count`` probes from ``ceil(count / facts)`` conversations; probe i asks fact ``i % facts`` of
    conversation ``i // facts``."""
    if not 1 <= facts <= len(FACTS):
        raise ValueError(f"facts must be in [1, {len(FACTS)}]; got {facts}")
    if filler_turns < 0:
        raise ValueError(f"filler_turns must be >= 0; got {filler_turns}")
    tag = settings_tag({"facts": facts, "filler_turns": filler_turns})
    probes: list[Probe] = []
    for conversation in range(-(-count // facts)):
        group = f"recall/{tag}/{seed}/{conversation}"
        probes.extend(_conversation(group, facts, filler_turns))
    return tuple(probes[:count])


def _conversation(group: str, facts: int, filler_turns: int) -> list[Probe]:
    rng = stable_rng(group)
    chosen = rng.sample(FACTS, facts)
    values = [str(rng.randint(10 ** (digits - 1), 10 ** digits - 1)) for _, digits in chosen]
    turns = [Message("system", SYSTEM)]
    for (name, _), value in zip(chosen, values):
        turns += [Message("user", f"My {name} is {value}. Please remember it."), Message("assistant", "Noted.")]
    for topic in rng.sample(TOPICS, min(filler_turns, len(TOPICS))):
        turns += [Message("user", f"Tell me one short fact about {topic}."),
                  Message("assistant", f"Here is one about {topic}: people have written about it for centuries.")]
    probes = []
    for j, ((name, _), value) in enumerate(zip(chosen, values)):
        question = Message("user", f"What is my {name}? Reply with the number only.")
        probes.append(Probe(id=f"{group}/{j}", family="recall", expected=value, extract="first_number",
                            group=group, messages=(*turns, question), max_tokens=len(value) + 4))
        turns += [question, Message("assistant", value)]  # answered right, so the next probe extends this one
    return probes
