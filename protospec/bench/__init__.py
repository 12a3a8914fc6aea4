"""python -m protospec.bench: latency of speculative decoding, flags as vLLM's benchmark_latency.py."""
