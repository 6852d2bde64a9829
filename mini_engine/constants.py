"""Constants shared by the model and the torch-free cache bookkeeping."""

# The Gated DeltaNet chunk length: prefill chunks, track snapshots and cache hits sit on multiples
# of it, and KV page sizes must divide it.
SNAPSHOT_ALIGN = 64

# The Triton decode step's projections with 16-bit weights: "cublas" (``inv.linear``, 64-row tiles),
# "triton" (``decode_rows.gemm.linear``: 16-row tiles, tiles past the batch skipped), or "auto" (per weight
# shape, whichever of those two and a few Triton configurations ran fastest on the device: ``gemm.choose``), or
# "tuned" (the same choice measured ahead of time for the GPU model, kept in the package: ``decode_rows.tuned``;
# cuBLAS for what it does not list).
DECODE_GEMMS = ("cublas", "triton", "auto", "tuned")

# The Triton decode step's Gated DeltaNet layers between their projections: "split" (three launches: the conv
# and prepared row, the replay of the slot's rows, the output norm), "two" (the conv and prepared row, then the
# replay with the output norm made by each value head's last V tile to finish: the same bits as "split") or "fused"
# (one: ``decode_rows.gdn_step``).
GDN_STEPS = ("split", "fused", "two")

# Who adds a Triton decode gemm's K parts where it splits K, for the projections the residual stream's norm reads
# (a mixer's output projection, the MLP's down projection): "norm" (that norm, as it reads them: no launch of their
# own) or "gemm" (a second launch of the gemm's). The same order and rounding either way: the same bits.
SPLIT_SUMS = ("norm", "gemm")

# The MLP's fused gate | up weight holds its gate and up rows a block of SWIGLU_BLOCK at a time (``FusedProjection(
# block=)``, where the width is a multiple): a swapped decode gemm tile's 64 weight rows then hold the gate and the up
# of the same 32 columns. Where the Triton decode step applies SiLU(gate) * up: "rows" (a launch of its own,
# ``silu_mul``) or "gemm" (the gate | up gemm's own launch, as its tile's epilogue, where its configuration has such a
# tile: ``decode_rows.gemm.swiglu``; elsewhere as "rows"). The same arithmetic and rounding either way: the same bits.
# "gemm" is the default: on an H100 (session 34) the engine's batch 1 854.1 against 834.1 and 844.4 tok/s.
SWIGLU_BLOCK = 32
SWIGLU_STEPS = ("rows", "gemm")

# The slot ledger's digests of the live slots a forward wrote: "tracked" (a memo per slot: a decode step's digest
# reads conv and the rows since the slot's last digest, rec only in a new chunk or after another write:
# ``ops.checksum.memo``) or "readback" (every digest reads the whole state, as a restore's or a clone's do).
STATE_DIGESTS = ("tracked", "readback")
