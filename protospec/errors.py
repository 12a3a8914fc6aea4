"""Errors that name the problem. Each is raised before any engine state changes."""


class ProtospecError(Exception):
    """Base class: every error the engine raises on bad input derives from it."""


class ConfigError(ProtospecError, ValueError):
    """An engine or sampling setting is out of range (bad k, bad temperature, ...)."""


class SamplingParamsError(ConfigError):
    """A sampling setting has the wrong type or is out of range (nan temperature, max_tokens=2.5, ...)."""


class ConcurrentUseError(ProtospecError, RuntimeError):
    """A second generate() call on an engine that is already generating (one engine, one caller)."""


class ModelLoadError(ProtospecError):
    """A model could not be resolved, read or matched with its partner model."""


class VocabMismatchError(ModelLoadError):
    """Draft and target disagree on the vocabulary, so draft token ids mean nothing to the target."""


class PromptError(ProtospecError, ValueError):
    """A prompt is empty, too long for the model, or holds token ids outside the vocabulary."""


class OutOfKVBlocksError(ProtospecError):
    """The KV block pool cannot hold what was asked of it."""


class KernelArgumentError(ProtospecError, ValueError):
    """A tensor handed to a Numba kernel launcher has the wrong dtype, device, shape or layout."""


class AdvanceStepError(ProtospecError):
    """The advance_step kernel met a position its block table does not cover (no K/V was written)."""


class ModelOutputError(ProtospecError):
    """The model computed NaN or inf logits (weights or activations out of the dtype's range)."""


class DeviceWaitError(ProtospecError, RuntimeError):
    """The device did not finish the work the host waited for within the engine's bound
    (EngineConfig.device_wait_timeout_s): a kernel is stuck, or far slower than the bound allows."""
