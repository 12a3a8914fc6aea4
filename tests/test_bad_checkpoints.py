"""Checkpoints and configs a user may hand over that are wrong in ways a type or a range shows: each is
refused by name (the file, the field, the tensor) before it can load as a model that quietly emits
token 0, and sizes no machine holds are refused before anything is allocated."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from tiny import DRAFT_CFG, TARGET_CFG, random_prompts, tiny_llm, write_config

from protospec import SamplingParams
from protospec.errors import ModelLoadError, ModelOutputError

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
TRAINED = Path(__file__).resolve().parents[1] / "data" / "models" / "protospec-target"


@pytest.mark.parametrize("change, match", [
    (dict(hidden_size="64"), r"hidden_size must be an integer in \[1, 65536\], got '64'"),
    (dict(num_attention_heads=0), r"num_attention_heads must be an integer in \[1, 1024\], got 0"),
    (dict(tie_word_embeddings="false"), "tie_word_embeddings must be true or false"),
], ids=["hidden_size_a_string", "no_heads", "tie_a_string"])
def test_config_fields_are_checked_before_anything_is_derived_from_them(tmp_path, change, match):
    path = write_config(tmp_path / "model", dict(TARGET_CFG, **change))
    with pytest.raises(ModelLoadError, match=match) as info:
        tiny_llm(path)
    assert "config.json" in str(info.value)


def _checkpoint(tmp_path, cfg=DRAFT_CFG, edit=None):
    """A saved checkpoint of dummy weights; edit(state) may change them before they are written."""
    from safetensors.torch import save_file

    from protospec.model.config import LlamaArchConfig
    from protospec.model.llama import LlamaForCausalLM
    from protospec.model.loader import init_dummy_weights

    model = LlamaForCausalLM(LlamaArchConfig.from_dict(cfg))
    init_dummy_weights(model, 0)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if "rotary" not in k and "rope" not in k}
    if edit is not None:
        edit(state)
    path = tmp_path / "ckpt"
    write_config(path, cfg)
    save_file(state, str(path / "model.safetensors"))
    return str(path)


def test_non_finite_weights_are_refused_by_the_tensors_name(tmp_path):
    def nan_norm(state):
        state["model.norm.weight"][3] = float("nan")

    with pytest.raises(ModelLoadError, match="'model.norm.weight' holds NaN or inf"):
        tiny_llm(_checkpoint(tmp_path, edit=nan_norm), load_format="auto")


def test_non_finite_logits_are_an_error_not_token_0_and_the_engine_stays_clean(tmp_path):
    """Finite weights whose products overflow float32 (an LM head near its largest value): the
    prefill's logits are inf / NaN, and the call says so instead of answering [0, 0, ...]."""
    def huge_head(state):
        head = state["lm_head.weight"]
        head.div_(head.abs().max()).mul_(3e38)  # the largest entry 3e38, all finite

    llm = tiny_llm(_checkpoint(tmp_path, edit=huge_head), load_format="auto")
    with pytest.raises(ModelOutputError, match="NaN or inf"):
        llm.generate(random_prompts(2), GREEDY)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks and not llm.engine.running and llm.engine.reserved_blocks == 0


@pytest.mark.parametrize("change", [dict(hidden_size=65536, num_attention_heads=1024, num_key_value_heads=1024),
                                    dict(intermediate_size=262144, num_hidden_layers=1024, hidden_size=16384,
                                         num_attention_heads=128, num_key_value_heads=128)],
                         ids=["wide", "deep"])
def test_a_model_no_memory_holds_is_refused_before_it_is_allocated(tmp_path, change):
    """Inside the per-field caps, but tens of GB to TB of weights: named with the size it needs."""
    from protospec.config import device_memory_bytes
    from protospec.model.config import LlamaArchConfig

    cfg = dict(TARGET_CFG, **change)
    if LlamaArchConfig.from_dict(cfg).num_parameters * 4 <= device_memory_bytes(torch.device("cpu")):
        pytest.skip("this machine's memory could hold it")
    with pytest.raises(ModelLoadError, match=r"B parameters need [0-9.]+ GiB for the float32 weights"):
        tiny_llm(write_config(tmp_path / "big", cfg))


def _tokenizer_checkpoint(tmp_path):
    path = tmp_path / "with_tokenizer"
    path.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TRAINED / f, path / f)
    return path


@pytest.mark.parametrize("broken", ["tokenizer.json", "tokenizer_config.json"])
def test_a_garbage_tokenizer_file_is_named(tmp_path, broken):
    path = _tokenizer_checkpoint(tmp_path)
    (path / broken).write_text('{"model": ')
    with pytest.raises(ModelLoadError, match=f"{broken}: not valid JSON"):
        tiny_llm(str(path))


def test_a_lone_surrogate_in_a_text_prompt_is_refused_and_the_engine_serves(tmp_path):
    llm = tiny_llm(str(_tokenizer_checkpoint(tmp_path)))
    from protospec.errors import PromptError

    with pytest.raises(PromptError, match="lone surrogates"):
        llm.generate("abc\ud800 def", GREEDY)
    assert len(llm.generate("abc def", GREEDY)[0].token_ids) == GREEDY.max_tokens
    assert json.loads((TRAINED / "config.json").read_text())["vocab_size"] == llm.engine.vocab_size
