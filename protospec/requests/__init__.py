"""The state of requests, below both the spec step and the engine: a request's tokens and KV block
table (sequence.py), the pool's blocks (block_manager.py), and what a request measured (metrics.py)."""
