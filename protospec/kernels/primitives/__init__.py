"""Device functions the kernel families share: warp and block reductions, wide word loads and
stores, the warp-level tensor-core product (mma.m16n8k16), and the split-K arrival count by which
the last block of a row group combines the others' partials (arrivals.py)."""
