"""The gated delta rule Triton kernels on CUDA against flash-linear-attention, side by side in one process.

Prefill: ``chunk_gated_delta_rule_triton`` vs ``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` on
16,384 bf16 tokens, 32 heads, K = V = 128, as one sequence and as 16 sequences of 1,024 (ours also
writes the fp32 state after every 64-token chunk; fla is timed with and without its final state), and
ours alone in float32 (3xTF32 dots: the engine's float32 configuration).
Decode: ``fused_recurrent_gated_delta_rule_triton`` vs fla's ``fused_recurrent_gated_delta_rule``
at batch 64, 32 heads, K = V = 128, float32 states (ours in place in shuffled pool slots), with the
state bandwidth (one read + one write of every state) against the H200's 4.17 TB/s copy bandwidth; and the
engine's step on chunk-exact slots (``pending_replay_decode_triton``), from its running copy and replaying.
Each launch configuration of ours is swept, with per-kernel times from the profiler for the default.
Median of triton's do_bench (L2 flushed between runs). Usage:
``python benchmarks/gdn_kernels.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from mini_engine.ops.gated_delta_rule.triton import (
    LaunchConfig,
    chunk_gated_delta_rule_triton,
)
from mini_engine.ops.gated_delta_rule.triton_decode import (
    fused_recurrent_gated_delta_rule_triton,
    pending_replay_decode_triton,
)

COPY_BANDWIDTH = 4.17e12  # bytes/s, H200 device-to-device copy (issue 9)
FLA_REFERENCE_US = {"prefill": 1410.0, "decode": 261.0}  # issue 9, measured on the H200
HEADS, HEAD_DIM, TOKENS, BATCH = 32, 128, 16384, 64
DEVICE = "cuda"
PREFILL_CONFIGS = [LaunchConfig(16), LaunchConfig(16, num_stages=3), LaunchConfig(32), LaunchConfig(32, num_stages=3),
                   LaunchConfig(32, num_warps=8), LaunchConfig(64, num_warps=8), LaunchConfig(64)]
DECODE_CONFIGS = [LaunchConfig(bv, num_warps=w, num_stages=1) for bv in (16, 32, 64) for w in (2, 4, 8)]


def load_fla():
    """fla's two entry points, or None (it may be absent, or fail to import against this triton)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception as error:  # noqa: BLE001 - any import failure means: no fla to compare with
        print(f"fla not installed ({type(error).__name__}: {error})")
        return None
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def timed_us(fn) -> float:
    return do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3


def config_name(config: LaunchConfig | None) -> str:
    if config is None:
        return "default"
    return f"block_v={config.block_v}, warps={config.num_warps}, stages={config.num_stages}"


def kernel_times_us(fn, calls: int = 5) -> dict[str, float]:
    """Mean device time per call of each kernel that ``fn`` launches (torch profiler)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", None)
        if device_us is None:
            device_us = event.self_cuda_time_total
        if device_us > 0:
            totals[event.key[:60]] += device_us / calls
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def inputs(tokens: int, heads: int, dim: int, dtype, seed: int) -> dict:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, generator=gen)

    return dict(q=F.normalize(randn(tokens, heads, dim), dim=-1).to(dtype),
                k=F.normalize(randn(tokens, heads, dim), dim=-1).to(dtype),
                v=randn(tokens, heads, dim).to(dtype),
                g=F.logsigmoid(randn(tokens, heads)),
                beta=torch.sigmoid(randn(tokens, heads)).to(dtype))


def row(kernel: str, variant: str, shape: str, time_us: float, reference: str, **extra) -> dict:
    return {"kernel": kernel, "variant": variant, "shape": shape, "time_us": time_us,
            "vs_fla_reference_us": time_us / FLA_REFERENCE_US[reference], **extra}


def prefill(lengths: list[int], fla, dtype=torch.bfloat16, sweep: bool = True) -> tuple[list[dict], dict]:
    x = inputs(sum(lengths), HEADS, HEAD_DIM, dtype, seed=len(lengths))
    cu_host = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    initial = torch.zeros(len(lengths), HEADS, HEAD_DIM, HEAD_DIM, device=DEVICE)
    shape = f"{len(lengths)} x {lengths[0]} tokens, {HEADS} heads, K=V={HEAD_DIM}, {str(dtype)[6:]}"

    def ours(config=None):
        return lambda: chunk_gated_delta_rule_triton(**x, cu_seqlens=cu_host, initial_state=initial, config=config)

    configs = [None, *PREFILL_CONFIGS] if sweep else [None]
    rows = [row("gdn prefill", f"ours, {config_name(c)}", shape, timed_us(ours(c)), "prefill") for c in configs]
    breakdown = {f"ours, {shape}": kernel_times_us(ours())}
    if fla is not None:
        batched = {name: t[None] for name, t in x.items()}
        cu_device = cu_host.to(DEVICE)

        def theirs(final: bool):
            return lambda: fla[0](**batched, cu_seqlens=cu_device, initial_state=initial if final else None,
                                  output_final_state=final)

        mine = ours()().output.float()
        error = ((theirs(True)()[0][0].float() - mine).norm() / mine.norm()).item()
        rows += [row("gdn prefill", "fla, initial + final state", shape, timed_us(theirs(True)), "prefill",
                     rel_diff_ours_vs_fla=error),
                 row("gdn prefill", "fla, no states", shape, timed_us(theirs(False)), "prefill")]
        breakdown[f"fla, {shape}"] = kernel_times_us(theirs(True))
    return rows, breakdown


def decode(fla) -> tuple[list[dict], dict]:
    x = inputs(BATCH, HEADS, HEAD_DIM, torch.bfloat16, seed=7)
    gen = torch.Generator(device=DEVICE).manual_seed(8)
    pool = 0.1 * torch.randn(BATCH + 1, HEADS, HEAD_DIM, HEAD_DIM, device=DEVICE, generator=gen)
    slots = (torch.randperm(BATCH, device=DEVICE, generator=gen) + 1).to(torch.int32)  # slot 0: padding sink
    state_bytes = 2 * BATCH * pool[0].nbytes
    shape = f"batch {BATCH}, {HEADS} heads, K=V={HEAD_DIM}, bf16 q/k/v, fp32 state"

    def with_bandwidth(r: dict) -> dict:
        rate = state_bytes / (r["time_us"] * 1e-6)
        return {**r, "state_bytes": state_bytes, "state_tb_s": rate / 1e12, "of_copy_bandwidth": rate / COPY_BANDWIDTH}

    def ours(config=None):
        return lambda: fused_recurrent_gated_delta_rule_triton(**x, state_pool=pool, state_indices=slots,
                                                               config=config)

    copy_src, copy_dst = pool[1:].clone(), torch.empty_like(pool[1:])
    rows = [with_bandwidth(row("gdn decode", "torch copy_ of the states (baseline)", shape,
                               timed_us(lambda: copy_dst.copy_(copy_src)), "decode"))]
    rows += [with_bandwidth(row("gdn decode", f"ours in place, {config_name(c)}", shape, timed_us(ours(c)), "decode"))
             for c in [None, *DECODE_CONFIGS]]
    breakdown = {f"ours, {shape}": kernel_times_us(ours())}
    rows += engine_decode(x, pool, slots, shape, with_bandwidth)
    if fla is not None:
        steps = {name: t[:, None] for name, t in x.items()}
        states = pool[slots.long()]

        def theirs():
            return fla[1](**steps, initial_state=states, output_final_state=True)

        rows.append(with_bandwidth(row("gdn decode", "fla fused_recurrent, new final state", shape, timed_us(theirs),
                                       "decode")))
        breakdown[f"fla, {shape}"] = kernel_times_us(theirs)
    return rows, breakdown


def engine_decode(x: dict, pool: torch.Tensor, slots: torch.Tensor, shape: str, with_bandwidth, pending: int = 31):
    """The engine's decode kernel on chunk-exact slots (``pending_replay_decode_triton``) at the same shape, the
    slots ``pending`` rows past their boundary: from the running copy (one row: what a step that follows a step
    does) and replaying the rows from the boundary state (what a stale count costs: before the count was kept by
    parity, every program that found a sibling's count replayed). The state traffic counted is the plain step's."""
    gen = torch.Generator(device=DEVICE).manual_seed(9)
    new_rows = torch.cat([x["q"].float().flatten(1), x["k"].float().flatten(1), x["v"].float().flatten(1),
                          x["g"].float(), x["beta"].float()], dim=1).contiguous()
    rows_pool = torch.randn(pool.shape[0], 63, new_rows.shape[1], device=DEVICE, generator=gen)
    gates = 2 * HEADS * HEAD_DIM + HEADS * HEAD_DIM
    rows_pool[..., gates : gates + HEADS] = -0.1 * rows_pool[..., gates : gates + HEADS].abs()  # decays below 1
    rows_pool[..., gates + HEADS :] = torch.sigmoid(rows_pool[..., gates + HEADS :])
    rec, run = pool.clone(), pool.clone()
    run_rows = torch.full((pool.shape[0], 2), -1, dtype=torch.int32, device=DEVICE)
    counts = torch.full((BATCH,), pending, dtype=torch.long, device=DEVICE)

    def step(memo: bool):
        run_rows.fill_(-1)
        if memo:  # the entry a step of ``pending`` rows reads; the step writes the other, so every call reads it
            run_rows[:, pending % 2] = pending
        return lambda: pending_replay_decode_triton(new_rows=new_rows, pending_pool=rows_pool, rec_pool=rec,
                                                    slots=slots, rows=counts, heads=(HEADS, HEADS), run_pool=run,
                                                    run_rows=run_rows)

    return [with_bandwidth(row("gdn decode", label, shape, timed_us(step(memo)), "decode"))
            for label, memo in ((f"engine step, running copy ({pending} rows pending)", True),
                                (f"engine step, replaying {pending} rows", False))]


def print_table(rows: list[dict], breakdown: dict) -> None:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"fla's reference on the H200: prefill {FLA_REFERENCE_US['prefill']:.0f} us, decode "
          f"{FLA_REFERENCE_US['decode']:.0f} us")
    print(f"{'kernel':<12}{'variant':<50}{'shape':<54}{'time':>11}{'/fla ref':>9}{'state TB/s':>11}{'of 4.17':>8}")
    for r in rows:
        rate = f"{r['state_tb_s']:.2f}" if "state_tb_s" in r else ""
        share = f"{100 * r['of_copy_bandwidth']:.0f}%" if "of_copy_bandwidth" in r else ""
        print(f"{r['kernel']:<12}{r['variant']:<50}{r['shape']:<54}{r['time_us']:>9.1f}us"
              f"{r['vs_fla_reference_us']:>9.2f}{rate:>11}{share:>8}")
    for r in rows:
        if "rel_diff_ours_vs_fla" in r:
            print(f"ours vs fla output, relative difference ({r['shape']}): {r['rel_diff_ours_vs_fla']:.2e}")
    for name, kernels in breakdown.items():
        print(f"per-kernel device time, {name}: " + "; ".join(f"{k} {us:.1f} us" for k, us in kernels.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="benchmarks/results/gdn_kernels.json")
    parser.add_argument("--no-sweep", action="store_true", help="time only the default launch configurations")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gdn_kernels.py needs a CUDA device")
    fla = load_fla()
    rows, breakdown = [], {}
    for lengths, dtype in (([TOKENS], torch.bfloat16), ([1024] * 16, torch.bfloat16)):
        part, kernels = prefill(lengths, fla, dtype, sweep=not args.no_sweep)
        rows, breakdown = rows + part, {**breakdown, **kernels}
    part, kernels = prefill([TOKENS], None, torch.float32, sweep=False)  # the engine's float32 configuration: 3xTF32 dots
    rows, breakdown = rows + part, {**breakdown, **kernels}
    part, kernels = decode(fla)
    rows, breakdown = rows + part, {**breakdown, **kernels}
    print_table(rows, breakdown)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                   "copy_bandwidth_reference": COPY_BANDWIDTH, "fla_reference_us": FLA_REFERENCE_US, "rows": rows,
                   "kernel_breakdown_us": breakdown}, handle, indent=2)


if __name__ == "__main__":
    main()
