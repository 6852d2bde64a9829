"""Constants shared by the model and the torch-free cache bookkeeping."""

# The Gated DeltaNet chunk length: prefill chunks, track snapshots and cache hits sit on multiples
# of it, and KV page sizes must divide it.
SNAPSHOT_ALIGN = 64
