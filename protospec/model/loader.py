"""Resolve a model name to an architecture config and weights.

A name is, in order of preference:
  1. a local directory holding a Hugging Face checkpoint (config.json + *.safetensors or *.bin);
  2. a hub id with a config bundled in data/configs/ (resolves offline with load_format="dummy");
  3. a hub id fetched through huggingface_hub (needs the network, or the local HF cache).

load_format="dummy" builds seeded random weights from the config alone, as vLLM's
`--load-format dummy` does, so benchmarks of shapes and latency run with no download.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from protospec.config import device_memory_bytes
from protospec.errors import ModelLoadError
from protospec.model.llama import LlamaForCausalLM
from protospec.model.config import LlamaArchConfig

LOAD_FORMATS = ("auto", "dummy")
BUNDLED_CONFIGS = Path(__file__).resolve().parents[2] / "data" / "configs"


def bundled_config_path(name: str) -> Path | None:
    path = BUNDLED_CONFIGS / name.replace("/", "--") / "config.json"
    return path if path.is_file() else None


def _download(name: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.bin", "*.model", "*.txt"]))
    except Exception as exc:  # network, auth, missing repo: all end the same way for the user
        raise ModelLoadError(
            f"{name!r} is not a local directory, and fetching it from the Hugging Face hub failed "
            f"({type(exc).__name__}: {exc}). "
            "With no network, pass a local checkpoint directory, or load_format='dummy' "
            "(CLI: --load-format dummy) to use random weights from a bundled or local config."
        ) from exc


def _looks_like_a_path(name: str) -> bool:
    """A hub id is 'name' or 'org/name'; anything rooted, relative-dotted, home-based or deeper is a path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def resolve_checkpoint(name: str, load_format: str) -> tuple[LlamaArchConfig, Path | None]:
    """Return the architecture and the checkpoint directory (None for a bundled config)."""
    if load_format not in LOAD_FORMATS:
        raise ModelLoadError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ModelLoadError(f"{local} is a directory but has no config.json")
        return LlamaArchConfig.from_json(local / "config.json"), local
    if local.exists():
        raise ModelLoadError(f"{local} is a file, not a checkpoint directory (one with config.json)")
    if _looks_like_a_path(name):
        raise ModelLoadError(f"no such directory: {local} (and {name!r} is not a Hugging Face hub id, "
                             "which reads 'name' or 'org/name')")
    bundled = bundled_config_path(name)
    if load_format == "dummy" and bundled is not None:
        return LlamaArchConfig.from_json(bundled), None
    directory = _download(name)
    return LlamaArchConfig.from_json(directory / "config.json"), directory


def read_state_dict(directory: Path) -> dict[str, torch.Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for f in files:
            try:
                state.update(load_file(str(f)))
            except Exception as e:  # safetensors raises its own error type for a truncated or corrupt file
                raise ModelLoadError(f"{f}: cannot read the weights ({type(e).__name__}: {e}); "
                                     "the file may be truncated or not a safetensors file") from e
        return state
    bins = sorted(directory.glob("pytorch_model*.bin"))
    if bins:
        state = {}
        for f in bins:
            try:
                state.update(torch.load(f, map_location="cpu", weights_only=True))
            except Exception as e:  # truncated, corrupt, or holding more than tensors (refused)
                raise ModelLoadError(f"{f}: cannot read the weights ({type(e).__name__}: {e})") from e
        return state
    raise ModelLoadError(f"no *.safetensors or pytorch_model*.bin weights in {directory}")


def check_fits_memory(name: str, cfg: LlamaArchConfig, dtype: torch.dtype, device: torch.device) -> None:
    """Refuse, before any allocation, a model whose weights cannot fit: they are made in float32 in the
    host's memory first, then placed on the device in `dtype`. Only the impossible is refused (all of
    the host's or the device's memory): a config inside the per-field caps can still ask for terabytes."""
    params = cfg.num_parameters
    needs = [(params * 4, torch.device("cpu"), "float32 weights in the host's memory while loading")]
    if device.type != "cpu":
        needs.append((params * torch.empty((), dtype=dtype).element_size(), device, f"{dtype} weights on {device}"))
    for need, where, what in needs:
        have = device_memory_bytes(where)
        if need > have:
            raise ModelLoadError(f"{name}: {params / 1e9:.2f}B parameters need {need / 2**30:.1f} GiB for the "
                                 f"{what}, more than the {have / 2**30:.1f} GiB there (hidden_size "
                                 f"{cfg.hidden_size}, intermediate_size {cfg.intermediate_size}, "
                                 f"{cfg.num_hidden_layers} layers, vocab {cfg.vocab_size})")


def check_finite(directory: Path, state: dict[str, torch.Tensor]) -> None:
    """NaN or inf in a checkpoint's weights would come out as every logit NaN and token 0 everywhere:
    refused by the tensor's name."""
    for key, tensor in state.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ModelLoadError(f"checkpoint {directory}: the weight {key!r} holds NaN or inf values; the "
                                 "checkpoint is corrupt or was saved after training diverged")


def init_dummy_weights(model: LlamaForCausalLM, seed: int) -> None:
    """Seeded random weights: normal(0, initializer_range) for matrices, ones for norms (as HF inits)."""
    gen = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * std)


def load_model(
    name: str,
    load_format: str = "auto",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    seed: int = 0,
    extra_positions: int = 0,
) -> LlamaForCausalLM:
    """extra_positions: RoPE table entries past max_position_embeddings (speculative lookahead)."""
    cfg, directory = resolve_checkpoint(name, load_format)
    check_fits_memory(name, cfg, dtype, torch.device(device))
    try:
        model = _build(name, cfg, directory, load_format, dtype, device, seed, extra_positions)
    except (torch.OutOfMemoryError, MemoryError, RuntimeError) as e:  # fits all the memory, not what is free
        if isinstance(e, RuntimeError) and "allocate memory" not in str(e) and "out of memory" not in str(e):
            raise
        raise ModelLoadError(f"{name}: out of memory while building {cfg.num_parameters / 1e9:.2f}B parameters "
                             f"for {device} in {dtype} ({type(e).__name__}); free memory or choose a smaller "
                             "model or dtype") from e
    return model


def _build(name, cfg, directory, load_format, dtype, device, seed, extra_positions) -> LlamaForCausalLM:
    model = LlamaForCausalLM(cfg, max_positions=cfg.max_position_embeddings + extra_positions)
    model.checkpoint_dir = directory
    if directory is None or load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        state = read_state_dict(directory)
        check_finite(directory, state)
        if cfg.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        try:
            missing, unexpected = model.load_state_dict(state, strict=False)
        except RuntimeError as e:  # a tensor whose shape the config does not give
            raise ModelLoadError(f"checkpoint {directory}: weights do not match config.json's shapes ({e})") from e
        missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
        unexpected = [u for u in unexpected if "rotary_emb" not in u]
        if missing or unexpected:
            raise ModelLoadError(f"checkpoint {name!r} does not match a Llama: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.place(device, dtype)


def load_tokenizer(checkpoint_dir: Path | None):
    """A transformers tokenizer when the checkpoint has one on disk; None otherwise (ids in, ids out)."""
    if checkpoint_dir is None or not any((checkpoint_dir / f).is_file() for f in ("tokenizer.json", "tokenizer.model")):
        return None
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):  # the JSON files, by name
        path = checkpoint_dir / f
        if path.is_file():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise ModelLoadError(f"{path}: not valid JSON ({e}); fix or remove the file") from e
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(checkpoint_dir))
    except Exception as e:  # a tokenizer file transformers cannot read: the checkpoint's fault, named
        raise ModelLoadError(f"{checkpoint_dir}: cannot load its tokenizer ({type(e).__name__}: {e})") from e

