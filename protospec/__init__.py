"""protospec: a research prototype of speculative decoding's draft loop (draft model + paged KV)."""
from protospec.config import EngineConfig, SamplingParams
from protospec.errors import (
    ConfigError,
    KernelArgumentError,
    ModelLoadError,
    OutOfKVBlocksError,
    PromptError,
    ProtospecError,
    VocabMismatchError,
)
from protospec.llm import LLM, RequestOutput

__all__ = [
    "LLM",
    "EngineConfig",
    "SamplingParams",
    "RequestOutput",
    "ProtospecError",
    "ConfigError",
    "ModelLoadError",
    "VocabMismatchError",
    "PromptError",
    "OutOfKVBlocksError",
    "KernelArgumentError",
]
