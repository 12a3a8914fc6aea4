"""protospec: a research prototype of speculative decoding's draft loop (draft model + paged KV)."""
from protospec.config import EngineConfig, SamplingParams
from protospec.errors import (
    ConcurrentUseError,
    ConfigError,
    DeviceWaitError,
    KernelArgumentError,
    ModelLoadError,
    ModelOutputError,
    OutOfKVBlocksError,
    PromptError,
    ProtospecError,
    SamplingParamsError,
    VocabMismatchError,
)
from protospec.engine.llm import LLM, RequestOutput

__all__ = [
    "LLM",
    "EngineConfig",
    "SamplingParams",
    "RequestOutput",
    "ProtospecError",
    "ConfigError",
    "SamplingParamsError",
    "ConcurrentUseError",
    "ModelLoadError",
    "VocabMismatchError",
    "PromptError",
    "OutOfKVBlocksError",
    "KernelArgumentError",
    "ModelOutputError",
    "DeviceWaitError",
]
