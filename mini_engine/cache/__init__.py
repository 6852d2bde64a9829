"""Cache bookkeeping in plain Python (no torch): slot and page allocators, the hybrid radix tree."""
