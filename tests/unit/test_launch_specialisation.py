"""A Triton prefill compiles the same kernels whatever the batch: no launch's specialisation follows the pack.

Triton compiles a kernel once per *specialisation* of its arguments: an integer divisible by 16 or equal to 1, a
pointer on a 16-byte boundary (``native_specialize_impl``; ``do_not_specialize`` opts out). Two specialisations
are two programs, and the compiler may lay a tile out otherwise in each (a load's vector width follows the
alignment it can prove), so a reduction may add in another order: a sequence's bits would then follow what it
was packed with, on a GPU only (the interpreter runs every program the same way). Here every launch of the
Triton forward is recorded, not run, for packs of one decode row, one prompt, and several sequences mid-chunk,
and of the decode step for batches of 1 to 17 sequences, and each launch site (kernel, constexprs, options and
the engine's calling lines) must meet one specialisation. For the decode step it is also warm-up time: each
variant is a compile, and a CUDA graph per batch size would otherwise compile new ones as the batch grows.
"""

import traceback

import torch
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.interpreter import InterpretedFunction

from mini_engine.model import build_builtin
from tests.unit.kernel_launches import _is_constexpr, launch_arguments

BACKEND = type(make_backend(GPUTarget("cuda", 90, 32)))  # the H200's specialisation rules, on the CPU


def _specialisation(fn, kwargs_of_kernel: dict, args: tuple, kwargs: dict) -> tuple:
    """(the launch site, the specialisation Triton would compile for it on the GPU)."""
    parameters, values, options = launch_arguments(fn, args, kwargs)
    plain = set(kwargs_of_kernel.get("do_not_specialize") or ())
    unaligned = set(kwargs_of_kernel.get("do_not_specialize_on_alignment") or ())
    constexprs, specialised = [], []
    for i, p in enumerate(parameters):
        if _is_constexpr(p):
            constexprs.append((p.name, repr(values[p.name])))
        else:
            kind, attribute = native_specialize_impl(BACKEND, values[p.name], False, not ({p.name, i} & plain),
                                                     not ({p.name, i} & unaligned))
            specialised.append((p.name, str(kind), str(attribute)))
    calling = tuple(f"{frame.filename.split('mini_engine/')[-1]}:{frame.lineno}" for frame in traceback.extract_stack()
                    if "mini_engine/" in frame.filename)
    return (fn.__module__, fn.__name__, tuple(constexprs), tuple(sorted(options.items())), calling), tuple(specialised)


class Launches:
    """Every Triton launch from here on, recorded instead of run: launch site -> {specialisation: the ``label`` of
    the workload that first met it}."""

    def __init__(self, monkeypatch) -> None:
        self.seen: dict[tuple, dict[tuple, str]] = {}
        self.label = ""
        launches = self

        def record(self, *args, grid, warmup, **kwargs):
            site, specialised = _specialisation(self.fn, self.kwargs, args, kwargs)
            launches.seen.setdefault(site, {}).setdefault(specialised, launches.label)

        monkeypatch.setattr(InterpretedFunction, "run", record)

    def assert_one_specialisation_per_site(self, at_least: int) -> None:
        assert len(self.seen) > at_least  # every kernel of the path was launched and recorded
        following = {site: variants for site, variants in self.seen.items() if len(variants) > 1}
        assert not following, "\n".join(_differences(site, variants) for site, variants in following.items())


def test_a_triton_forward_compiles_one_specialisation_per_launch_site_whatever_the_pack(monkeypatch):
    """Packs of one decode row (a pack of one row makes views whose strides are otherwise free), one prompt, and
    four sequences (two continuing mid-chunk with pending rows, one decode row): every launch site meets one
    specialisation."""
    launches = Launches(monkeypatch)
    model = build_builtin("tiny-random")
    gen = torch.Generator().manual_seed(0)

    def tokens(n):
        return torch.randint(0, 256, (n,), generator=gen)

    def forward(name, prompts, states):
        launches.label = name
        return [out.state for out in model(prompts, states, kernels="triton", snapshots="last")]

    forward("one row", [tokens(1)], [model.new_state()])
    started = forward("one prompt", [tokens(100), tokens(70)], [model.new_state(), model.new_state()])
    forward("four sequences", [tokens(1), tokens(30), tokens(3), tokens(64)],
            [started[0], started[1], model.new_state(), model.new_state()])
    launches.assert_one_specialisation_per_site(at_least=20)


def _differences(site: tuple, variants: dict[tuple, str]) -> str:
    """``kernel at line: pack: name=(type, attribute) ...`` for the arguments whose specialisation differs."""
    names = {name for args in variants for name, *_ in args
             if len({tuple(a) for other in variants for a in other if a[0] == name}) > 1}
    return f"{site[0]}.{site[1]} at {site[4][-1]}: " + "; ".join(
        f"{pack}: " + " ".join(f"{name}={kind}/{attribute or '-'}" for name, kind, attribute in args if name in names)
        for args, pack in variants.items())


def test_a_decode_step_compiles_one_specialisation_per_launch_site_whatever_the_batch(monkeypatch):
    """Decode steps of 1, 2, 3, 16 and 17 sequences, with the GDN layer in three launches and in one, cuBLAS and
    Triton gemms: every launch site meets one specialisation, so growing the batch compiles nothing new (the step's
    index rows lie at multiples of the batch: their alignment, and a stride of 1, follow the batch size)."""
    from mini_engine.device.sim import SimDevice
    from mini_engine.engine.storage import KVStorage, StateStorage
    from mini_engine.model.decode import DecodeModel, Pools, decode_step

    launches = Launches(monkeypatch)
    model = build_builtin("tiny-random")
    config = model.config
    states = StateStorage(config, 20, SimDevice(), running=True)
    kv = KVStorage(config, 80, 16, SimDevice())
    pools = Pools(states.conv, states.rec, states.pending, kv.keys, kv.values, states.run, states.run_rows)
    for decoder in (DecodeModel(model), DecodeModel(model, gdn="fused"), DecodeModel(model, gdn="two"),
                    DecodeModel(model, gemm="triton")):
        for size in (1, 2, 3, 16, 17):
            launches.label = f"batch {size}"
            table = torch.arange(1, 1 + size * 4, dtype=torch.int32).reshape(size, 4)
            decode_step(decoder, pools, torch.arange(size) + 3, list(range(1, size + 1)), [5 + i for i in range(size)],
                        table)
    launches.assert_one_specialisation_per_site(at_least=8)
