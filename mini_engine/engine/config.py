"""Engine configuration, validated on construction."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from mini_engine.constants import DECODE_GEMMS, GDN_STEPS, SNAPSHOT_ALIGN, SPLIT_SUMS, STATE_DIGESTS, SWIGLU_STEPS
from mini_engine.faults import parse_faults

__all__ = ["DONATE_POLICIES", "DTYPES", "KERNEL_CHOICES", "EngineConfig"]

DONATE_POLICIES = ("copy", "transfer")
KERNEL_CHOICES = ("auto", "reference", "triton")  # decode_kernels and prefill_kernels
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # model name (default probe-tiny; tiny-random) or checkpoint folder
    device: str = "sim"
    device_seed: int = 0
    page_size: int = 16
    num_pages: int = 1024
    num_slots: int = 96
    max_running: int = 8
    prefill_chunk: int = 128  # tokens per prefill forward; a multiple of 64 (chunks align to 64)
    overlap: bool = False  # build batch N+1 while batch N runs
    enable_cache: bool = True
    donate_policy: str = "copy"  # "copy": tree gets a private clone; "transfer": tree takes the slot id
    max_context: int = 4096
    max_media_bytes: int = 4096  # per media item
    threads: int | None = 1  # torch intra-op threads; small ops lose badly to oversubscription
    debug: bool = False  # check every pool's and the tree's integrity after every step
    # The harness's request: with a sink, every donation also reports the checksum of the state its
    # prefix should have, recomputed cold and alone (a ``reference_state`` row; costs a prefill).
    reference_states: bool = False
    # With a sink, how the ledger digests the live slots a forward wrote (``constants.STATE_DIGESTS``): "tracked"
    # reads only what the slot's last digest did not; "readback" the whole state every time.
    state_digests: str = "tracked"
    # How decode steps run: "reference" through HybridModel.forward (states gathered and scattered),
    # "triton" through model.decode.decode_step (the kernels, on the pools in place; needs a GPU or
    # TRITON_INTERPRET=1), "auto": triton on cuda, reference on the sim.
    decode_kernels: str = "auto"
    # How the sequence ops and projections of a forward through HybridModel.forward (prefills; decode steps
    # too with the reference decode) run: "reference" (the float32 references, inv.linear's 64-row gemm
    # tiles), "triton" (the kernels, reading the packed state, one gemm launch per projection; needs a GPU
    # or TRITON_INTERPRET=1: ``mini_engine.model.kernels``), "auto": triton on cuda, reference on the sim.
    prefill_kernels: str = "auto"
    cuda_graphs: bool = True  # the triton decode on cuda replays one CUDA graph per batch size
    # The triton decode's 16-bit projections (constants.DECODE_GEMMS): "tuned" is the packaged table's choice
    # for the GPU model (``ops.decode_rows.tuned``), cuBLAS wherever the table has none.
    decode_gemm: str = "tuned"
    # A table file of such choices (``scripts/tune_decode_gemms.py --out FILE``) that "tuned" reads in the package's
    # place: a GPU model the package does not list, tuned where it runs, or a re-tuning tried before it replaces the
    # package's. None: the package's.
    decode_gemm_table: str | None = None
    # The triton decode's Gated DeltaNet layers: three launches, two or one (constants.GDN_STEPS).
    decode_gdn: str = "split"
    # Who adds the K parts of a triton decode gemm that splits K, where the residual stream's norm reads its output:
    # that norm ("norm": no launch of their own) or the gemm's second launch ("gemm"); the same bits
    # (constants.SPLIT_SUMS).
    decode_split_sums: str = "norm"
    # Where the triton decode applies the MLP's SiLU(gate) * up: the gate | up gemm's own launch where its Triton tile
    # holds a block of both ("gemm"), or a launch of its own ("rows"); the same bits (constants.SWIGLU_STEPS).
    decode_swiglu: str = "gemm"
    # The triton decode's Triton kernels as programmatic dependent launches: each may start while the one before
    # still runs, and waits for it before it reads anything (the same bits). Needs a Hopper GPU (``ops.pdl``).
    # None: on wherever the device and the triton can (``runner.ModelRunner``), off elsewhere.
    decode_pdl: bool | None = None
    # The projections' weights (linear layers, embedding, head) and gemm inputs; the residual stream,
    # norms, gates, recurrent states and KV stay float32. "bfloat16" halves the bytes a decode step reads.
    dtype: str = "float32"
    # Safeguards switched off (``mini_engine.faults.FAULTS``); "donate=transfer" and
    # donate_policy="transfer" are the same thing and each implies the other.
    faults: Iterable[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        try:
            faults = parse_faults(self.faults)
        except ValueError as err:
            raise ValueError(f"EngineConfig.faults: {err}") from None
        if self.donate_policy == "transfer":
            faults |= {"donate=transfer"}
        object.__setattr__(self, "faults", faults)
        if "donate=transfer" in faults:
            object.__setattr__(self, "donate_policy", "transfer")
        if self.page_size < 1 or SNAPSHOT_ALIGN % self.page_size:
            raise ValueError(f"EngineConfig.page_size={self.page_size} must divide {SNAPSHOT_ALIGN}")
        if self.prefill_chunk < SNAPSHOT_ALIGN or self.prefill_chunk % SNAPSHOT_ALIGN:
            raise ValueError(f"EngineConfig.prefill_chunk={self.prefill_chunk} must be a positive multiple "
                             f"of {SNAPSHOT_ALIGN}")
        if self.donate_policy not in DONATE_POLICIES:
            raise ValueError(f"EngineConfig.donate_policy={self.donate_policy!r}; allowed: {DONATE_POLICIES}")
        for name in ("num_pages", "num_slots", "max_running", "max_context", "max_media_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1; got {getattr(self, name)}")
        if self.num_slots < 3 * self.max_running:
            raise ValueError(f"EngineConfig.num_slots={self.num_slots} must be >= 3 * max_running "
                             f"({3 * self.max_running}): each running request holds a live and two ping-pong slots")
        if self.device not in ("sim", "cuda"):
            raise ValueError(f"EngineConfig.device must be 'sim' or 'cuda'; got {self.device!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"EngineConfig.dtype={self.dtype!r}; allowed: {DTYPES}")
        if self.decode_gemm not in DECODE_GEMMS:
            raise ValueError(f"EngineConfig.decode_gemm={self.decode_gemm!r}; allowed: {DECODE_GEMMS}")
        if self.decode_gemm_table is not None:
            if self.decode_gemm != "tuned":
                raise ValueError(f"EngineConfig.decode_gemm_table is read by decode_gemm='tuned' alone; got "
                                 f"decode_gemm={self.decode_gemm!r}")
            # read once, here: a missing or malformed file is an error now, not at the engine's first decode, and
            # the engine decodes with the table as it was then
            object.__setattr__(self, "_gemm_table", self._read_gemm_table())
        if self.state_digests not in STATE_DIGESTS:
            raise ValueError(f"EngineConfig.state_digests={self.state_digests!r}; allowed: {STATE_DIGESTS}")
        if self.decode_gdn not in GDN_STEPS:
            raise ValueError(f"EngineConfig.decode_gdn={self.decode_gdn!r}; allowed: {GDN_STEPS}")
        if self.decode_split_sums not in SPLIT_SUMS:
            raise ValueError(f"EngineConfig.decode_split_sums={self.decode_split_sums!r}; allowed: {SPLIT_SUMS}")
        if self.decode_swiglu not in SWIGLU_STEPS:
            raise ValueError(f"EngineConfig.decode_swiglu={self.decode_swiglu!r}; allowed: {SWIGLU_STEPS}")
        if self.decode_pdl and (self.device != "cuda" or self.decode_kernels == "reference"):
            raise ValueError(f"EngineConfig.decode_pdl=True launches the triton decode's kernels on a GPU: it needs "
                             f"device='cuda' and decode_kernels 'triton' or 'auto'; got device={self.device!r}, "
                             f"decode_kernels={self.decode_kernels!r}")
        for name in ("decode_kernels", "prefill_kernels"):
            choice = getattr(self, name)
            if choice not in KERNEL_CHOICES:
                raise ValueError(f"EngineConfig.{name}={choice!r}; allowed: {KERNEL_CHOICES}")
            if choice == "triton" and self.device == "sim" and os.environ.get("TRITON_INTERPRET") != "1":
                raise ValueError(f"EngineConfig.{name}='triton' on the sim needs TRITON_INTERPRET=1 in the "
                                 f"environment (set before triton is imported); or use {name}='reference'")

    def gemm_table(self) -> dict | None:
        """``decode_gemm_table`` as read when the config was made (``ops.decode_rows.tuned.load``), or None: the
        package's table."""
        return getattr(self, "_gemm_table", None)

    def _read_gemm_table(self) -> dict:
        from mini_engine.ops.decode_rows import tuned

        if not os.path.isfile(self.decode_gemm_table):
            raise ValueError(f"EngineConfig.decode_gemm_table={self.decode_gemm_table!r}: no such file (write one "
                             "with scripts/tune_decode_gemms.py --out FILE on the GPU)")
        try:
            return tuned.load(self.decode_gemm_table)
        except ValueError as err:
            raise ValueError(f"EngineConfig.decode_gemm_table: {err}") from None

    @property
    def decode_path(self) -> str:
        """"reference" or "triton": ``decode_kernels`` with "auto" resolved for the device."""
        return self._resolve(self.decode_kernels)

    @property
    def prefill_path(self) -> str:
        """"reference" or "triton": ``prefill_kernels`` with "auto" resolved for the device."""
        return self._resolve(self.prefill_kernels)

    def _resolve(self, choice: str) -> str:
        if choice == "auto":
            return "triton" if self.device == "cuda" else "reference"
        return choice

    @property
    def bit_exact(self) -> bool:
        """Whether a hit reproduces its cold run bit for bit (logits and slot states alike).

        True on the sim with the reference decode: the CPU primitives are batch-invariant
        (``tests/unit/test_invariant.py``) and prefill and decode share them. False on cuda: with the
        reference prefill a hit's logits differ from its cold run's in the last bits on the H200 (the
        chunked rule gives a sequence other bits next to other sequences, ~2e-7;
        ``benchmarks/gpu_invariance.py``); with the Triton prefill 0 of 55 hits differed there
        (``benchmarks/hit_divergence.py``), but nothing in CI can hold a GPU to that.
        False with the Triton decode anywhere: its kernels are batch-invariant, but a position computed
        by a decode step (a reply a follow-up turn restores) gets other bits than the same position
        computed by a prefill (its cold run). There only greedy tokens and the copies' own checksums
        compare exactly. False with the Triton prefill (no test holds the interpreter's kernels to bits).
        False in bfloat16 (the oracle's exactness is a float32 property)."""
        return (self.device == "sim" and self.decode_path == self.prefill_path == "reference"
                and self.dtype == "float32")

    def has_fault(self, name: str) -> bool:
        """Whether the safeguard ``name`` removes is switched off (``name`` must be a known fault)."""
        return name in parse_faults([name]) & self.faults
