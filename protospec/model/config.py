"""The architecture numbers our Llama forward reads, parsed from a Hugging Face `config.json`."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from protospec.errors import ModelLoadError


# (field, least, most): the most bounds what one config may make the engine allocate (RoPE tables,
# embeddings) before anything else is checked.
ARCH_INT_BOUNDS = (
    ("hidden_size", 1, 65536), ("intermediate_size", 1, 262144), ("num_hidden_layers", 1, 1024),
    ("num_attention_heads", 1, 1024), ("num_key_value_heads", 1, 1024), ("head_dim", 1, 1024),
    ("vocab_size", 1, 1 << 22), ("max_position_embeddings", 1, 1 << 20),
)


def _check_int(name: str, value, low: int, high: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ModelLoadError(f"{name} must be an integer in [{low}, {high}], got {value!r}")


@dataclass(frozen=True)
class LlamaArchConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        """Every number the forward reads, checked here: a config that passes cannot fail later with a
        ZeroDivisionError or generate zeros."""
        for name, low, high in ARCH_INT_BOUNDS:
            _check_int(name, getattr(self, name), low, high)
        for name in ("rms_norm_eps", "rope_theta"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise ModelLoadError(f"{name} must be a finite number > 0, got {value!r}")
        if self.head_dim % 2:
            raise ModelLoadError(f"head_dim must be even (RoPE rotates pairs of dims), got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ModelLoadError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    @classmethod
    def from_dict(cls, cfg: dict) -> "LlamaArchConfig":
        model_type = cfg.get("model_type", "llama")
        if model_type != "llama":
            raise ModelLoadError(f"protospec runs Llama models only, got model_type={model_type!r}")
        # The fields other fields are derived from, checked before they are used: "64" or 0 heads would
        # otherwise surface as a TypeError or ZeroDivisionError that names no field.
        for name, low, high in ARCH_INT_BOUNDS:
            if name in cfg and cfg[name] is not None:
                _check_int(name, cfg[name], low, high)
        tie = cfg.get("tie_word_embeddings", False)
        if not isinstance(tie, bool):  # a string "false" is truthy: it would tie the weights
            raise ModelLoadError(f"tie_word_embeddings must be true or false (a JSON boolean), got {tie!r}")
        heads = cfg["num_attention_heads"]
        # transformers 5.x moved rope_theta into rope_parameters; 4.x keeps it at the top level.
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise ModelLoadError(f"rope scaling {rope_type!r} is not supported (only plain RoPE)")
        rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        eos = cfg.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0]
        return cls(
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            vocab_size=cfg["vocab_size"],
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            tie_word_embeddings=tie,
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos,
            pad_token_id=cfg.get("pad_token_id"),
            initializer_range=cfg.get("initializer_range", 0.02),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> "LlamaArchConfig":
        """Parse a config.json; every failure names the file and what was wrong with it."""
        try:
            with open(path) as f:
                cfg = json.load(f)
        except OSError as e:
            raise ModelLoadError(f"{path}: cannot read it ({e.strerror or e})") from e
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelLoadError(f"{path}: not valid JSON ({e})") from e
        if not isinstance(cfg, dict):
            raise ModelLoadError(f"{path}: expected a JSON object, got {type(cfg).__name__}")
        try:
            return cls.from_dict(cfg)
        except KeyError as e:
            raise ModelLoadError(f"{path}: missing the key {e.args[0]!r}") from e
        except ModelLoadError as e:
            raise ModelLoadError(f"{path}: {e}") from e
        except (TypeError, ValueError, ZeroDivisionError) as e:
            raise ModelLoadError(f"{path}: a field has the wrong type or value ({type(e).__name__}: {e})") from e

    @property
    def num_parameters(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        kv = self.num_key_value_heads * self.head_dim
        q = self.num_attention_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
        lm_head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_hidden_layers * per_layer + h + lm_head
