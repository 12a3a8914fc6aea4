"""Paged attention for decode-shaped forwards: paged_attention.py chooses among the work
decompositions (by_kv_head, mma on tensor cores) and combines their split-K partials."""
