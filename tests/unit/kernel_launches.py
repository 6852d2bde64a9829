"""Record every Triton launch of the engine's paths in the interpreter, then compile each for the H200 (sm_90).

The interpreter runs a kernel as Python, so a construct the compiler rejects, or a configuration that asks
more shared memory than the GPU has, shows only on a GPU. Here, in two processes (the interpreter's
kernels and the compiler's cannot share one):

- ``record FILE`` (TRITON_INTERPRET=1): runs the paths on a two-layer model of the 0.8B shape (its head
  sizes decide the kernels' block sizes), in float32 and with bfloat16 projections: the Triton forward,
  decode steps (whole and split attention, cuBLAS and Triton gemms, every gemm configuration and the gate | up
  gemm with the MLP's activation, the GDN layer in three launches, two and one; every kernel of a step as a
  programmatic dependent launch), the
  gated delta rule's walk in every configuration a GPU may pick (float32 and bf16 inputs), the conv,
  KV, checksum (slots and the logits check) and slot-copy kernels. Launches are recorded,
  not run (their outputs are never read), and written with their argument types, constexpr values and
  launch options, one entry per distinct signature.
- ``compile FILE`` (no interpreter): compiles each entry to a cubin for sm_90 with this machine's triton
  and prints, per entry, the shared memory it asks, its registers per thread and the bytes it spills
  (``ptxas -v``, triton's own ptxas), or the compiler's error, as JSON. The registers and spills are a
  static profile of where a kernel is short of registers, read without a GPU; nothing asserts them.
- ``report FILE``: both steps, each in its own process, then a table of the distinct compiled kernels,
  the most spilled first, printed and written to FILE as JSON (``benchmarks/results/kernel_registers_*``).

Run from the repository root: ``python -m tests.unit.kernel_launches report OUT.json``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import sys

import torch

TARGET = ("cuda", 90, 32)  # the H200: compute capability 9.0, warps of 32
SHARED_LIMIT = 232_448  # bytes of shared memory one H200 block may use (227 KiB)

_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int64: "i64",
          torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}


def _type(value):
    if isinstance(value, tuple):  # a tuple argument: its elements' types
        return tuple(_type(v) for v in value)
    if isinstance(value, torch.Tensor):
        return "*" + _TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    if type(value).__name__ == "TensorDescriptor":  # triton's own name for it: tensordesc<bf16[64, 256]>
        from triton.runtime.jit import mangle_type

        return mangle_type(value)
    raise TypeError(f"no Triton type for an argument {value!r}")


def _is_constexpr(parameter: inspect.Parameter) -> bool:
    annotation = parameter.annotation
    return annotation is not inspect.Parameter.empty and "constexpr" in str(annotation)


def launch_arguments(fn, args: tuple, kwargs: dict) -> tuple[list[inspect.Parameter], dict, dict]:
    """A launch of kernel ``fn`` bound: (its parameters, each one's value, defaults included, and the launch options
    num_warps / num_stages / launch_pdl)."""
    parameters = list(inspect.signature(fn).parameters.values())
    values = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    values.update(zip((p.name for p in parameters), args))
    values.update({k: v for k, v in kwargs.items() if k in {p.name for p in parameters}})
    return parameters, values, {k: v for k, v in kwargs.items() if k in ("num_warps", "num_stages", "launch_pdl")}


def record(path: str) -> None:
    from triton.runtime.interpreter import InterpretedFunction

    seen: dict[str, dict] = {}

    def recorded(self, *args, grid, warmup, **kwargs):
        fn = self.fn
        parameters, values, options = launch_arguments(fn, args, kwargs)
        constexprs = {p.name: values[p.name] for p in parameters if _is_constexpr(p)}
        signature = {p.name: "constexpr" if _is_constexpr(p) or values[p.name] is None else _type(values[p.name])
                     for p in parameters}
        entry = {"module": fn.__module__, "kernel": fn.__name__, "signature": signature, "constexprs": constexprs,
                 "options": options}
        seen.setdefault(json.dumps(entry, sort_keys=True, default=str), entry)

    InterpretedFunction.run = recorded
    _exercise()
    with open(path, "w") as handle:
        json.dump(list(seen.values()), handle, indent=1, default=str)


def _exercise() -> None:
    from mini_engine.constants import GDN_STEPS
    from mini_engine.device.sim import SimDevice
    from mini_engine.engine.storage import KVStorage, StateStorage
    from mini_engine.model import HybridModel
    from mini_engine.model.builtin import QWEN35_08B, builtin_config, init_weights
    from mini_engine.model.config import FULL, LINEAR
    from mini_engine.model.decode import DecodeModel, Pools, decode_step
    from mini_engine.ops import pdl
    from mini_engine.ops.attention.triton import paged_decode_attention, write_kv_pages
    from mini_engine.ops.causal_conv1d.triton import causal_conv1d_update
    from mini_engine.ops.checksum.memo import StateMemo
    from mini_engine.ops.checksum.state_triton import copy_state_lanes, state_lanes
    from mini_engine.ops.checksum.triton import checksum_lanes, row_digests
    from mini_engine.ops.decode_rows import gemm
    from mini_engine.ops.gated_delta_rule.triton import (
        chunk_gated_delta_rule_triton,
        walk_configs,
    )
    from mini_engine.ops.gated_delta_rule.triton_decode import (
        fused_recurrent_gated_delta_rule_triton,
    )
    from mini_engine.ops.slot_copy.triton import copy_slots

    config = dataclasses.replace(builtin_config(QWEN35_08B), layer_types=(LINEAR, FULL))
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 256, (n,), generator=gen) for n in (70, 5)]
    for dtype in (torch.float32, torch.bfloat16):
        model = init_weights(HybridModel(config)).cast_projections(dtype)
        model(prompts, [model.new_state() for _ in prompts], kernels="triton", snapshots="last")
        states = StateStorage(config, 3, SimDevice(), running=True)
        kv = KVStorage(config, 40, 16, SimDevice())
        pools = Pools(states.conv, states.rec, states.pending, kv.keys, kv.values, states.run, states.run_rows)
        for pages in (4, 32):  # a table of 64 keys (one pass) and of 512 (split, merged)
            table = torch.arange(1, 1 + 2 * pages, dtype=torch.int32).reshape(2, pages)
            for name in ("cublas", "triton"):
                decode_step(DecodeModel(model, gemm=name), pools, torch.tensor([3, 4]), [1, 2], [5, 63], table)
            for gdn in ("fused", "two"):
                decode_step(DecodeModel(model, gdn=gdn), pools, torch.tensor([3, 4]), [1, 2], [5, 63], table)
            for gdn in GDN_STEPS:  # every kernel of the step as a dependent launch (recorded, not run)
                decode_step(DecodeModel(model, gemm="triton", gdn=gdn, pdl=True), pools, torch.tensor([3, 4]), [1, 2],
                            [5, 63], table)
        if dtype == torch.bfloat16:
            weight = model.model.layers[0].mlp.down_proj.weight
            x = torch.zeros(64, weight.shape[1], dtype=dtype)
            for choice in gemm.configs(*weight.shape):
                gemm.linear(x, weight, rows=1, config=choice)
            gate_up = model.model.layers[0].mlp.gate_up.weight()  # the MLP's activation in its gemm's epilogue
            gemm.swiglu(torch.zeros(64, gate_up.shape[1], dtype=dtype), gate_up, rows=1, block=32, out_dtype=dtype,
                        config=gemm.GemmConfig(64, 256, swap=True, tma=True, pdl=True))
            # the swapped tile as a programmatic dependent launch (decode_gemms.py's "pdl"; recorded, not run:
            # the interpreter has no griddepcontrol)
            gemm.linear(x, weight, rows=1, config=gemm.GemmConfig(64, 256, swap=True, tma=True, pdl=True))
            # and asking the L2 for its weight rows before its wait, their first two stages or whole (not a
            # candidate; decode_gemms.py times it)
            for split, fused, columns in ((1, False, 256), (4, True, 1 << 16)):
                gemm.linear(x, weight, rows=1, config=gemm.GemmConfig(64, 128, split_k=split, swap=True, tma=True,
                                                                      pdl=True, fused_sum=fused, prefetch=columns))
            with pdl.launches(True):  # a split summed by a second launch, in a dependent decode step
                gemm.linear(x, weight, rows=1, config=gemm.GemmConfig(64, 128, split_k=2))
            for tma in (False, True):  # a split whose parts the tile's last program adds (fused_sum)
                gemm.linear(x, weight, rows=1, config=gemm.GemmConfig(64, 128, split_k=4, swap=True, tma=tma,
                                                                      fused_sum=True))
    heads, dim, tokens = 32, 128, 130
    g, beta = -torch.rand(tokens, heads), torch.rand(tokens, heads)
    for dtype in (torch.float32, torch.bfloat16):  # the walk in every configuration a GPU may pick for it
        q, k, v = (torch.randn(tokens, heads, dim).to(dtype) for _ in range(3))
        for walk in walk_configs(dtype):
            chunk_gated_delta_rule_triton(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=torch.tensor([0, 100, tokens]),
                                          config=walk)
    pool = torch.zeros(3, heads, dim, dim)
    fused_recurrent_gated_delta_rule_triton(q=q[:2], k=k[:2], v=v[:2], g=g[:2], beta=beta[:2], state_pool=pool,
                                            state_indices=torch.tensor([1, 2]))
    states = StateStorage(config, 3, SimDevice())
    conv_pool = states.conv[:, 0]
    causal_conv1d_update(x=torch.zeros(2, conv_pool.shape[1]), weight=torch.zeros(conv_pool.shape[1], 4),
                         conv_pool=conv_pool, slot_indices=torch.tensor([1, 2]), activation="silu")
    kv = KVStorage(config, 40, 16, SimDevice())
    new = torch.zeros(2, config.num_key_value_heads, config.head_dim)
    write_kv_pages(k_cache=kv.keys[:, 0], v_cache=kv.values[:, 0], k=new, v=new, slot_mapping=torch.tensor([17, 3]))
    queries = torch.zeros(2, config.num_attention_heads, config.head_dim)
    paged_decode_attention(q=queries, k_cache=kv.keys[:, 0], v_cache=kv.values[:, 0], seq_lens=torch.tensor([5, 300]),
                           page_table=torch.arange(1, 39, dtype=torch.int32).reshape(2, 19))  # split, not gated
    for tensor in (states.conv, states.rec, states.pending, kv.keys):
        checksum_lanes(pool=tensor, slots=torch.tensor([1, 2], dtype=torch.int32))
    checksum_lanes(pool=states.pending, slots=torch.tensor([1], dtype=torch.int32), rows=torch.tensor([5]))
    for memo in (None, StateMemo(4, torch.device("cpu"))):  # the ledger's state digests: read back, and tracked
        state_lanes(conv=states.conv, rec=states.rec, pending=states.pending, memo=memo,
                    slots=torch.tensor([1, 2], dtype=torch.int32), lengths=torch.tensor([5, 64], dtype=torch.int32))
    for recurrent in (True, False):  # a ledger's restore or clone (and with restore_rec=off)
        copy_state_lanes(conv=states.conv, rec=states.rec, pending=states.pending, dst=1, src=2, length=5,
                         recurrent=recurrent)
    for width in (260, 9000):  # the logits check of the byte vocabulary (one launch) and of a wide one (two)
        row_digests(torch.zeros(2, width), drop_sign=True)
    copy_slots(pools=[states.conv, states.rec], dst=torch.tensor([1]), src=torch.tensor([2]), pending=states.pending,
               rows=torch.tensor([7]))


def _before(ptx: str, first: str, then: str) -> int:
    """-1 if ``ptx`` has no ``first``, else 1 if its first ``first`` comes before its first ``then`` (or there is none),
    else 0."""
    at, then_at = ptx.find(first), ptx.find(then)
    return -1 if at < 0 else int(then_at < 0 or at < then_at)


def compile_all(path: str) -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    def tuples(value):  # JSON wrote a tuple argument's types as a list
        return tuple(tuples(v) for v in value) if isinstance(value, list) else value

    results = []
    for entry in json.load(open(path)):
        kernel = getattr(importlib.import_module(entry["module"]), entry["kernel"])
        signature = {name: tuples(kind) for name, kind in entry["signature"].items()}
        what = {"module": entry["module"], "kernel": entry["kernel"], "constexprs": entry["constexprs"],
                "options": entry["options"]}
        try:
            compiled = triton.compile(ASTSource(fn=kernel, signature=signature,
                                                constexprs=entry["constexprs"]),
                                      target=GPUTarget(*TARGET), options=entry["options"])
            results.append({**what, "shared": compiled.metadata.shared, **_registers(compiled.asm["ptx"]),
                            # a dependent launch's wait for the kernel before it (``ops.pdl.begin``)
                            "waits": "griddepcontrol.wait" in compiled.asm["ptx"],
                            # where it asks the L2 for its weights (``GemmConfig.prefetch``): -1 none, else whether
                            # before that wait
                            "prefetches": _before(compiled.asm["ptx"], "cp.async.bulk.prefetch",
                                                  "griddepcontrol.wait")})
        except Exception as error:  # the compiler's own message is the finding
            results.append({**what, "error": f"{type(error).__name__}: {error}"[:2000]})
    json.dump(results, sys.stdout)


def _registers(ptx: str) -> dict:
    """Registers per thread and spilled bytes (stores, loads) of a kernel's PTX, from triton's ptxas."""
    import os
    import re
    import subprocess
    import tempfile

    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as handle:
            handle.write(ptx)
        report = subprocess.run([ptxas, "-v", "--gpu-name", f"sm_{TARGET[1]}a", source, "-o", os.devnull],
                                capture_output=True, text=True, timeout=120).stderr
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    return {"registers": int(registers.group(1)) if registers else None,
            "spill_bytes": [int(spills.group(1)), int(spills.group(2))] if spills else None}


def run_step(step: str, path: str, *, interpret: bool) -> str:
    """``record`` or ``compile`` in a process of its own (the interpreter set or not); returns its stdout."""
    import os
    import subprocess
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, "-m", "tests.unit.kernel_launches", step, str(path)],
                          cwd=Path(__file__).resolve().parents[2], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"kernel_launches {step} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def report(path: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        launches = f"{folder}/launches.json"
        run_step("record", launches, interpret=True)
        results = json.loads(run_step("compile", launches, interpret=False))
    import triton

    kernels = {}
    for r in results:
        if "error" in r:
            print(f"does not compile: {r['module']}.{r['kernel']} {r['constexprs']}: {r['error'][:300]}")
            continue
        key = (r["module"].split("ops.")[-1] + "." + r["kernel"], r["registers"], tuple(r["spill_bytes"] or ()),
               r["shared"])
        kernels.setdefault(key, r["constexprs"])
    rows = [{"kernel": k[0], "registers": k[1], "spill_bytes": list(k[2]), "shared": k[3], "constexprs": c}
            for k, c in sorted(kernels.items(), key=lambda kv: (-(kv[0][2] or (0,))[0], kv[0][0]))]
    print(f"sm_{TARGET[1]}, triton {triton.__version__}: {len(results)} signatures, {len(rows)} distinct kernels, "
          f"{sum(1 for r in rows if r['spill_bytes'] and r['spill_bytes'][0])} spill")
    print(f"{'kernel':<48}{'registers':>10}{'spill st/ld':>14}{'shared':>9}")
    for r in rows:
        spill = "/".join(map(str, r["spill_bytes"])) or "?"
        print(f"{r['kernel']:<48}{r['registers'] or '?':>10}{spill:>14}{r['shared']:>9}")
    with open(path, "w") as handle:
        json.dump({"target": f"sm_{TARGET[1]}", "triton": triton.__version__, "signatures": len(results),
                   "kernels": rows}, handle, indent=1, default=str)


if __name__ == "__main__":
    {"record": record, "compile": compile_all, "report": report}[sys.argv[1]](sys.argv[2])
