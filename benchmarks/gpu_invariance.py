"""Which of the engine's float32 primitives are batch-invariant on this device, and by how much the
others move a row: the exactness oracle (a hit must reproduce its cold run bit for bit) holds only if
every one of them is.

For each primitive, one row (or one sequence) is computed alone and then inside batches of other
rows at several sizes and positions; the table gives whether every result was bit-identical and the
largest absolute difference seen. On the CPU every row must read "yes" (``tests/unit/test_invariant.py``
holds them to it); on a GPU this says which ops a batch-invariant kernel must replace. The last row
is the whole tiny model: one sequence's logits alone and packed with others.

Usage: ``python benchmarks/gpu_invariance.py [--device cuda|cpu] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json

import torch

from mini_engine.model import build_builtin
from mini_engine.ops import invariant as inv
from mini_engine.ops.attention import attention_with_prefix
from mini_engine.ops.causal_conv1d import causal_conv1d
from mini_engine.ops.gated_delta_rule import chunk_gated_delta_rule

BATCHES = (2, 3, 17, 64, 65, 130)


def compare(alone: torch.Tensor, inside: list[torch.Tensor]) -> dict:
    diffs = [float((alone - x).abs().max()) for x in inside]
    return {"bit_identical": all(torch.equal(alone, x) for x in inside), "max_abs_diff": max(diffs)}


def rows_alone_vs_batched(fn, width: int, device: str, seed: int) -> dict:
    """``fn`` maps [n, width] -> [n, ...] row-wise; the probe row alone vs at three positions in each batch."""
    gen = torch.Generator().manual_seed(seed)
    row = torch.randn(1, width, generator=gen).to(device)
    alone, inside = fn(row)[0], []
    for n in BATCHES:
        batch = torch.randn(n, width, generator=gen).to(device)
        for pos in sorted({0, n // 2, n - 1}):
            batch[pos] = row[0]
            inside.append(fn(batch)[pos])
    return compare(alone, inside)


def packed_sequences(fn, lengths: list[int], device: str, seed: int) -> dict:
    """``fn(cu_seqlens, total)`` -> per-token output; sequence 0 (length lengths[0]) alone vs first and
    last in packs with the other lengths."""
    gen = torch.Generator().manual_seed(seed)
    probe = lengths[0]
    data = fn.make(probe, gen, device)
    alone = fn(data, [probe])
    inside = []
    for others in ([5], [64, 130], [1] * 16, [1] * 40, [300]):
        for first in (True, False):
            parts = [fn.make(n, gen, device) for n in others]
            pack = [data, *parts] if first else [*parts, data]
            out = fn([torch.cat(cols) for cols in zip(*pack)], [p[0].shape[0] for p in pack])
            start = 0 if first else sum(others)
            inside.append(out[start : start + probe])
    return compare(alone, inside)


class Gdn:
    """Chunked gated delta rule over packed sequences, 4 value heads of 32: the reference, or the Triton kernel
    (``config``: its walk's launch configuration; None, the default it picks for the shape)."""

    def __init__(self, kernels: str = "reference", config=None):
        self.kernels, self.config = kernels, config

    @staticmethod
    def make(n: int, gen, device):
        q, k = (torch.nn.functional.normalize(torch.randn(n, 2, 32, generator=gen), dim=-1) for _ in range(2))
        v = torch.randn(n, 4, 32, generator=gen)
        g, beta = -torch.rand(n, 4, generator=gen), torch.rand(n, 4, generator=gen)
        return [t.to(device) for t in (q, k, v, g, beta)]

    def __call__(self, cols, lengths):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        q, k, v, g, beta = cols
        if self.kernels == "triton":
            from mini_engine.ops.gated_delta_rule.triton import (
                chunk_gated_delta_rule_triton as rule,
            )

            return rule(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu, config=self.config).output
        return chunk_gated_delta_rule(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu).output


def walk_configurations(device: str, seed: int) -> dict:
    """The Triton gated delta rule on one pack of 41 sequences (enough to fill the SMs with the widest V tile)
    under each walk configuration a GPU may pick, against the first: whether the tile alone changes a bit.
    The kernel picks its configuration by the shape alone, so this decides nothing in the engine; it says
    whether the choice could."""
    from mini_engine.ops.gated_delta_rule.triton import walk_configs

    gen = torch.Generator().manual_seed(seed)
    lengths = [70, 130, 5, *([1] * 38)]
    cols = [torch.cat(c) for c in zip(*(Gdn.make(n, gen, device) for n in lengths))]
    outputs = [Gdn("triton", c)(cols, lengths) for c in walk_configs(torch.float32) if c.block_v <= 32]
    return compare(outputs[0], outputs[1:])


class Attention:
    """Causal attention with no prefix, 4 query / 2 KV heads of 32."""

    @staticmethod
    def make(n: int, gen, device):
        return [torch.randn(n, h, 32, generator=gen).to(device) for h in (4, 2, 2)]

    def __call__(self, cols, lengths):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        q, k, v = cols
        return attention_with_prefix(q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu)


class Conv:
    """Depthwise causal conv (width 4, SiLU) over 96 channels from a zero state."""

    weight = None

    def make(self, n: int, gen, device):
        if self.weight is None:
            self.weight = torch.randn(96, 4, generator=gen).to(device)
        return [torch.randn(n, 96, generator=gen).to(device)]

    def __call__(self, cols, lengths):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
        zeros = cols[0].new_zeros(len(lengths), 96, 3)
        return causal_conv1d(x=cols[0], weight=self.weight, cu_seqlens=cu, initial_state=zeros,
                             activation="silu").output


class WholeModel:
    """The tiny model's logits at every position of a fresh sequence."""

    def __init__(self, device):
        self.model = build_builtin("tiny-random").to(device)

    @staticmethod
    def make(n: int, gen, device):
        return [torch.randint(0, 256, (n,), generator=gen)]

    def __call__(self, cols, lengths):
        tokens = list(cols[0].split(lengths))
        results = self.model(tokens, [self.model.new_state() for _ in tokens], all_logits=True)
        return torch.cat([r.logits for r in results])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = args.device
    torch.backends.cuda.matmul.allow_tf32 = False
    weight_small = torch.randn(384, 128, generator=torch.Generator().manual_seed(1)).to(device)
    weight_large = torch.randn(6144, 1024, generator=torch.Generator().manual_seed(2)).to(device)
    b0 = torch.randn(32, 64, generator=torch.Generator().manual_seed(3)).to(device)
    rows = {
        "linear 128->384 (tiled)": rows_alone_vs_batched(lambda x: inv.linear(x, weight_small), 128, device, 1),
        "linear 1024->6144 (tiled)": rows_alone_vs_batched(lambda x: inv.linear(x, weight_large), 1024, device, 2),
        "bmm [64x32]x[32x64], batch count": rows_alone_vs_batched(
            lambda x: inv.bmm(x.reshape(-1, 64, 32), b0.expand(x.shape[0], 32, 64)).reshape(x.shape[0], -1),
            64 * 32, device, 3),
        "rms_norm over 1024": rows_alone_vs_batched(lambda x: inv.rms_norm(x, 1e-6), 1024, device, 4),
        "l2_normalize over 128": rows_alone_vs_batched(inv.l2_normalize, 128, device, 5),
        "sigmoid / silu / softplus": rows_alone_vs_batched(
            lambda x: torch.cat([inv.sigmoid(x), inv.silu(x), inv.softplus(x)], -1), 999, device, 6),
        "attention (packed sequences)": packed_sequences(Attention(), [70], device, 7),
        "gated delta rule (packed sequences)": packed_sequences(Gdn(), [70], device, 8),
        "causal conv1d (packed sequences)": packed_sequences(Conv(), [70], device, 9),
        "tiny model logits (packed sequences)": packed_sequences(WholeModel(device), [70], device, 10),
    }
    if device.startswith("cuda"):  # the engine's Triton prefill kernel (the interpreter would take minutes)
        rows["gated delta rule, Triton (packed sequences)"] = packed_sequences(Gdn("triton"), [70], device, 8)
        rows["gated delta rule, Triton, V tile 16 vs 32"] = walk_configurations(device, 11)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"{name}, torch {torch.__version__}, float32, TF32 off")
    print(f"{'primitive':<40}{'bit-identical':>14}{'max |diff|':>12}")
    for primitive, r in rows.items():
        print(f"{primitive:<40}{'yes' if r['bit_identical'] else 'NO':>14}{r['max_abs_diff']:>12.2e}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
