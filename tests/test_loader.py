import pytest
import torch

from protospec.errors import ModelLoadError
from protospec.model.loader import bundled_config_path, load_model, resolve_checkpoint
from protospec.model.config import LlamaArchConfig


@pytest.mark.parametrize("name, layers", [("JackFram/llama-160m", 12), ("JackFram/llama-68m", 2)])
def test_bundled_seed_configs_resolve_offline(name, layers):
    cfg, directory = resolve_checkpoint(name, "dummy")
    assert directory is None and bundled_config_path(name) is not None
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (768, 3072, 12, 12)
    assert (cfg.vocab_size, cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.rope_theta) == (32000, 2048, 1e-6, 10000.0)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id, cfg.tie_word_embeddings) == (0, 2, 1, False)
    assert cfg.num_hidden_layers == layers


def test_dummy_weights_are_seeded(tiny_target):
    a, b, c = (load_model(tiny_target, "dummy", seed=s) for s in (0, 0, 1))
    wa, wb, wc = (m.model.layers[0].mlp.up_proj.weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)
    assert torch.equal(a.model.norm.weight, torch.ones_like(a.model.norm.weight))


def test_rope_parameters_of_transformers_5_and_4_are_both_read():
    base = dict(hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2, vocab_size=10)
    assert LlamaArchConfig.from_dict(dict(base, rope_theta=123.0)).rope_theta == 123.0
    assert LlamaArchConfig.from_dict(dict(base, rope_parameters={"rope_theta": 77.0, "rope_type": "default"})).rope_theta == 77.0
    with pytest.raises(ModelLoadError, match="rope scaling"):
        LlamaArchConfig.from_dict(dict(base, rope_scaling={"rope_type": "llama3", "factor": 8.0}))
    with pytest.raises(ModelLoadError, match="Llama"):
        LlamaArchConfig.from_dict(dict(base, model_type="mistral"))


def test_bad_load_format_and_directory_without_config(tmp_path):
    with pytest.raises(ModelLoadError, match="load_format"):
        resolve_checkpoint("JackFram/llama-68m", "pt")
    with pytest.raises(ModelLoadError, match="no config.json"):
        resolve_checkpoint(str(tmp_path), "auto")
    (tmp_path / "config.json").write_text('{"hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "vocab_size": 10}')
    with pytest.raises(ModelLoadError, match="no \\*.safetensors"):
        load_model(str(tmp_path), "auto")


def test_hub_id_loads_what_the_hub_download_returns(monkeypatch, tmp_path):
    """With network, a hub id resolves through huggingface_hub.snapshot_download (mocked here with a
    local checkpoint): the real weights are loaded, not dummy ones."""
    import huggingface_hub
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM as HFLlama

    torch.manual_seed(3)
    hf = HFLlama(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                             vocab_size=50, max_position_embeddings=64))
    hf.save_pretrained(tmp_path)
    asked = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda name, **kw: asked.append(name) or str(tmp_path))
    model = load_model("someone/tiny-llama", "auto")
    assert asked == ["someone/tiny-llama"]
    assert torch.equal(model.model.embed_tokens.weight, hf.model.embed_tokens.weight)


@pytest.mark.parametrize("name", ["/nonexistent/dir", "./no-such-checkpoint", "~/nowhere/at/all", "data/no/such/model"])
def test_a_missing_directory_is_named_not_sent_to_the_hub(name):
    with pytest.raises(ModelLoadError, match="no such directory"):
        resolve_checkpoint(name, "auto")


def test_a_file_is_not_a_checkpoint_directory(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is a file, not a checkpoint directory"):
        resolve_checkpoint(str(path), "auto")
