"""How many KV blocks the engine's pool gets, checked against the device before anything is allocated."""
from __future__ import annotations

import torch

from protospec.config import EngineConfig, device_memory_bytes
from protospec.requests.block_manager import blocks_for
from protospec.errors import ConfigError
from protospec.model.runner import ModelRunner


def size_kv_pool(cfg: EngineConfig, device: torch.device, dtype: torch.dtype, max_positions: int, models: list) -> int:
    """Blocks for every model's cache: num_kv_blocks as given, or what kv_cache_gib holds (capped at
    what max_num_seqs sequences of max_positions can use). Refused, before the pool is allocated, when
    it exceeds the device: a typo must not try for tens of GB (or build a list of 10^9 free block ids)."""
    per_seq = blocks_for(max_positions, cfg.block_size)
    enough = cfg.max_num_seqs * per_seq + 1  # + the null block
    per_block = sum(ModelRunner.kv_bytes_per_block(m, cfg.block_size, dtype) for m in models)
    if cfg.num_kv_blocks is not None:
        blocks = cfg.num_kv_blocks
    else:
        gib = cfg.kv_cache_gib if cfg.kv_cache_gib is not None else (2.0 if device.type == "cuda" else 0.25)
        blocks = max(2, min(enough, int(gib * 2**30) // per_block))
    capacity = device_memory_bytes(device)
    if blocks * per_block > capacity:
        what = f"num_kv_blocks={blocks}" if cfg.num_kv_blocks is not None else f"kv_cache_gib={cfg.kv_cache_gib}"
        raise ConfigError(f"{what} needs {blocks * per_block / 2**30:.1f} GiB of KV cache ({per_block} bytes per "
                          f"block), more than the {capacity / 2**30:.1f} GiB this {device.type} device has")
    return blocks
