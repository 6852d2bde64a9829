"""Checks of the gated delta rule Triton kernels against the reference, shared by the interpreter
tests (tests/unit/test_gdn_triton.py) and the CUDA tests (tests/gpu/test_gdn_triton_gpu.py).

Inputs are drawn in float32 on the CPU (the same numbers on every device), rounded to the kernel's
dtype, and the float32 reference runs on those rounded values on the same device.
"""

from __future__ import annotations

import torch

from mini_engine.ops.gated_delta_rule import chunk_gated_delta_rule, recurrent_gated_delta_rule
from mini_engine.ops.gated_delta_rule.triton import chunk_gated_delta_rule_triton
from mini_engine.ops.gated_delta_rule.triton_decode import fused_recurrent_gated_delta_rule_triton
from mini_engine.ops.invariant import l2_normalize
from tests.unit.kernel_support import TOLERANCE, offsets, randn, relative_error

LAYERS = 2  # pools are one layer of an engine-like [slots, layers, Hv, K, V] store: strided slots


def gdn_inputs(*, tokens, hk, hv, k_dim, v_dim, dtype, device, seed=0) -> dict:
    """q, k (L2-normalised), v, g (log-decay in [-0.5, 0)), beta in (0, 1): packed [tokens, heads, ...]."""
    gen = torch.Generator().manual_seed(seed)
    return dict(
        q=l2_normalize(randn(tokens, hk, k_dim, gen=gen)).to(device=device, dtype=dtype),
        k=l2_normalize(randn(tokens, hk, k_dim, gen=gen)).to(device=device, dtype=dtype),
        v=randn(tokens, hv, v_dim, gen=gen, dtype=dtype, device=device),
        g=(-0.5 * torch.rand(tokens, hv, generator=gen)).to(device),
        beta=torch.sigmoid(randn(tokens, hv, gen=gen)).to(device),
    )


def state_store(*, n_slots, hv, k_dim, v_dim, device, seed=1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return 0.1 * randn(n_slots, LAYERS, hv, k_dim, v_dim, gen=gen, device=device)


def shuffled_slots(n_slots: int, count: int, device, seed=2) -> torch.Tensor:
    order = torch.randperm(n_slots, generator=torch.Generator().manual_seed(seed))
    return order[:count].to(device=device, dtype=torch.int32)


def assert_close(actual, expected, dtype, what: str) -> float:
    error = relative_error(actual, expected)
    assert error <= TOLERANCE[dtype], f"{what}: relative error {error:.3g} > {TOLERANCE[dtype]:g} ({dtype})"
    return error


def _check_result(got, want, dtype, lengths) -> float:
    errors = [assert_close(got.output, want.output, dtype, "prefill output"),
              assert_close(got.final_state, want.final_state, dtype, "prefill final state")]
    for s, (mine, theirs) in enumerate(zip(got.boundary_states, want.boundary_states, strict=True)):
        assert mine.shape == theirs.shape == (lengths[s] // 64, *want.final_state.shape[1:]), f"seq {s} boundaries"
        if theirs.numel():
            errors.append(assert_close(mine, theirs, dtype, f"boundary states of sequence {s}"))
    return max(errors)


def check_prefill(*, lengths, hk, hv, k_dim, v_dim, dtype, device, source, config=None, seed=0) -> float:
    """Varlen prefill vs the reference: output, final and boundary states; ``source`` of the initial
    states is "none", "tensor" or "pool" (then the final states land in the named slots, nothing else moves)."""
    inputs = gdn_inputs(tokens=sum(lengths), hk=hk, hv=hv, k_dim=k_dim, v_dim=v_dim, dtype=dtype, device=device,
                        seed=seed)
    cu = offsets(lengths)
    store = state_store(n_slots=len(lengths) + 3, hv=hv, k_dim=k_dim, v_dim=v_dim, device=device)
    pool, slots = store[:, 1], shuffled_slots(len(lengths) + 3, len(lengths), device)
    initial = None if source == "none" else pool[slots.long()]
    want = chunk_gated_delta_rule(**inputs, cu_seqlens=cu, initial_state=initial)
    if source == "pool":
        before = store.clone()
        got = chunk_gated_delta_rule_triton(**inputs, cu_seqlens=cu, state_pool=pool, state_indices=slots,
                                            config=config)
        assert torch.equal(pool[slots.long()], got.final_state), "final states written into their slots"
        before[:, 1][slots.long()] = got.final_state
        assert torch.equal(store, before), "prefill wrote outside its slots"
    else:
        got = chunk_gated_delta_rule_triton(**inputs, cu_seqlens=cu, initial_state=initial, config=config)
    assert got.output.dtype == dtype and got.final_state.dtype == torch.float32
    return _check_result(got, want, dtype, lengths)


def check_boundary_out(*, lengths, hk, hv, k_dim, v_dim, device) -> None:
    """Boundary states land in a caller's flat buffer, sequence after sequence, as views."""
    inputs = gdn_inputs(tokens=sum(lengths), hk=hk, hv=hv, k_dim=k_dim, v_dim=v_dim, dtype=torch.float32,
                        device=device)
    flat = torch.full((sum(n // 64 for n in lengths), hv, k_dim, v_dim), float("nan"), device=device)
    got = chunk_gated_delta_rule_triton(**inputs, cu_seqlens=offsets(lengths), boundary_out=flat)
    assert torch.equal(torch.cat(got.boundary_states), flat) and not flat.isnan().any()
    assert all(b.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for b in got.boundary_states)
    want = chunk_gated_delta_rule(**inputs, cu_seqlens=offsets(lengths))
    assert_close(flat, torch.cat(want.boundary_states), torch.float32, "boundary_out")


def check_decode(*, batch, hk, hv, k_dim, v_dim, dtype, device, config=None, seed=3) -> float:
    """One decode step in shuffled pool slots vs the recurrent reference; other slots untouched."""
    inputs = gdn_inputs(tokens=batch, hk=hk, hv=hv, k_dim=k_dim, v_dim=v_dim, dtype=dtype, device=device, seed=seed)
    store = state_store(n_slots=batch + 4, hv=hv, k_dim=k_dim, v_dim=v_dim, device=device)
    pool, slots = store[:, 1], shuffled_slots(batch + 4, batch, device)
    want = recurrent_gated_delta_rule(**inputs, cu_seqlens=offsets([1] * batch), initial_state=pool[slots.long()])
    before = store.clone()
    out = fused_recurrent_gated_delta_rule_triton(**inputs, state_pool=pool, state_indices=slots, config=config)
    assert out.dtype == dtype
    errors = [assert_close(out, want.output, dtype, "decode output"),
              assert_close(pool[slots.long()], want.final_state, torch.float32, "decode state (float32 throughout)")]
    before[:, 1][slots.long()] = pool[slots.long()]
    assert torch.equal(store, before), "decode wrote outside its slots"
    return max(errors)


def check_decode_continues_prefill(*, prompt, steps, hk, hv, k_dim, v_dim, device) -> None:
    """Prefill then decode steps in one slot equal a prefill of the whole sequence (outputs, state)."""
    inputs = gdn_inputs(tokens=prompt + steps, hk=hk, hv=hv, k_dim=k_dim, v_dim=v_dim, dtype=torch.float32,
                        device=device)
    pool = state_store(n_slots=3, hv=hv, k_dim=k_dim, v_dim=v_dim, device=device)[:, 0]
    slot = torch.tensor([1], dtype=torch.int32, device=device)
    whole = chunk_gated_delta_rule_triton(**inputs, cu_seqlens=offsets([prompt + steps]), initial_state=pool[1:2])
    head = {name: t[:prompt] for name, t in inputs.items()}
    prefix = chunk_gated_delta_rule_triton(**head, cu_seqlens=offsets([prompt]), state_pool=pool, state_indices=slot)
    outputs = [prefix.output]
    for t in range(prompt, prompt + steps):
        token = {name: x[t : t + 1] for name, x in inputs.items()}
        outputs.append(fused_recurrent_gated_delta_rule_triton(**token, state_pool=pool, state_indices=slot))
    assert_close(torch.cat(outputs), whole.output, torch.float32, "prefill + decode outputs")
    assert_close(pool[1], whole.final_state[0], torch.float32, "prefill + decode state")
