"""The layer kernels' linears and the ops between them: the tensor-core GEMV (gemv_mma.py) with its
fused prologues and epilogues (norm, RoPE with the cache store, SiLU x up, residual), and the
unfused norms, RoPE and SiLU (layer_ops.py)."""
