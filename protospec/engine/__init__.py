"""The serving side: the LLM front door, the engine's scheduler, sequences, KV blocks, metrics."""
