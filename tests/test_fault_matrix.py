"""The fault matrix: wrong types, non-finite numbers, corrupt checkpoints, impossible configs, huge
sizes, a second caller, interrupts and a soak. Each bad input gets a named error; after each one the
engine gives the same greedy tokens as a fresh engine and no KV block leaks."""
import json
import threading

import numpy as np
import pytest
import torch
from tiny import DRAFT_CFG, TARGET_CFG, random_prompts, tiny_llm, write_config

from protospec import (ConcurrentUseError, ConfigError, ModelLoadError, PromptError, SamplingParams,
                       SamplingParamsError)

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_target, tiny_draft):
    return tiny_llm(tiny_target, tiny_draft, k=3, block_size=4, num_kv_blocks=64)


@pytest.fixture(scope="module")
def reference(tiny_target, tiny_draft):
    return [o.token_ids for o in tiny_llm(tiny_target, tiny_draft, k=3).generate(random_prompts(2), GREEDY)]


def _still_serves(llm, reference):
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_usable_blocks and not llm.engine.running and not llm.engine.waiting
    assert [o.token_ids for o in llm.generate(random_prompts(2), GREEDY)] == reference


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=float("nan")), "temperature"),
    (dict(temperature=float("inf")), "temperature"),
    (dict(temperature="1.0"), "temperature"),
    (dict(max_tokens=2.5), "max_tokens"),
    (dict(max_tokens=True), "max_tokens"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(top_k=2.0), "top_k"),
    (dict(top_p=float("nan")), "top_p"),
    (dict(top_p=0.0), "top_p"),
    (dict(seed=-1), "seed"),
    (dict(seed=2**64), "seed"),
    (dict(seed=1.5), "seed"),
    (dict(ignore_eos="yes"), "ignore_eos"),
])
def test_sampling_params_refuse_what_they_cannot_mean(kwargs, match):
    with pytest.raises(SamplingParamsError, match=match):
        SamplingParams(**kwargs)


def test_sampling_params_cannot_change_behind_the_checks():
    params = SamplingParams(max_tokens=8)
    with pytest.raises(AttributeError):
        params.max_tokens = 2.5
    assert SamplingParams(max_tokens=np.int64(8), seed=np.int64(3)).max_tokens == 8  # numpy ints are ints


@pytest.mark.parametrize("prompt, match", [
    ([1.0, 2.5], "must be integers, got float"),
    ([["5", "17"]], "must be integers, got str"),  # a list of strings is a batch of texts; ids as strings are not ids
    ([True, 7], "must be integers, got bool"),
    (np.array([1.0, 2.0]), "integer dtype, got 1-D float64"),
    (torch.tensor([1.0, 2.0]), "integer dtype, got 1-D torch.float32"),
    (torch.tensor([[[1, 2]]]), "1-D"),
    (torch.tensor([True, False]), "integer dtype"),
    (object(), "got object"),
], ids=["floats", "strings", "bools", "numpy-float", "torch-float", "3-D", "torch-bool", "object"])
def test_prompts_that_are_not_token_ids_are_refused_by_name(llm, reference, prompt, match):
    with pytest.raises(PromptError, match=match):
        llm.generate(prompt, GREEDY)
    _still_serves(llm, reference)


def test_integer_arrays_and_tensors_are_prompts(llm):
    ids = random_prompts(2, lengths=(9,))
    expected = [o.token_ids for o in llm.generate(ids, GREEDY)]
    assert [o.token_ids for o in llm.generate(torch.tensor(ids), GREEDY)] == expected        # 2-D: rows
    assert [o.token_ids for o in llm.generate(np.array(ids[0], dtype=np.int32), GREEDY)] == expected[:1]
    assert [o.token_ids for o in llm.generate([np.int64(t) for t in ids[0]], GREEDY)] == expected[:1]


def test_sampling_params_of_the_wrong_type_are_refused(llm, reference):
    with pytest.raises(SamplingParamsError, match="got dict"):
        llm.generate(random_prompts(1), {"temperature": 0.0})
    _still_serves(llm, reference)


def test_a_second_caller_is_refused_at_once_and_the_first_gets_the_right_tokens(tiny_target, tiny_draft):
    llm = tiny_llm(tiny_target, tiny_draft, k=3)
    prompts, long_run = random_prompts(4), SamplingParams(temperature=0.0, max_tokens=120, ignore_eos=True)
    expected = [o.token_ids for o in tiny_llm(tiny_target, tiny_draft, k=3).generate(prompts, long_run)]
    started, results = threading.Event(), {}
    original_step = llm.engine.step

    def step():
        started.set()
        original_step()
    llm.engine.step = step

    worker = threading.Thread(target=lambda: results.update(out=llm.generate(prompts, long_run)))
    worker.start()
    assert started.wait(30)
    with pytest.raises(ConcurrentUseError, match="already running"):
        llm.generate(random_prompts(1), GREEDY)
    worker.join(60)
    assert [o.token_ids for o in results["out"]] == expected
    assert len(llm.generate(random_prompts(1), GREEDY)[0].token_ids) == 10  # free again


def test_an_interrupt_mid_generate_leaks_nothing(llm, reference):
    original_step, calls = llm.engine.step, []

    def step():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        original_step()
    llm.engine.step = step
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(random_prompts(3), GREEDY)
    finally:
        llm.engine.step = original_step
    _still_serves(llm, reference)


def test_a_refused_draft_loop_leaves_the_engine_as_it_was(llm, reference):
    before = llm.engine.config.draft_loop
    with pytest.raises(ConfigError, match="draft_loop"):
        llm.engine.set_draft_loop("bogus")
    assert llm.engine.config.draft_loop == before
    _still_serves(llm, reference)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_speculative_tokens=10**6), "num_speculative_tokens"),
    (dict(num_speculative_tokens=2.0), "num_speculative_tokens"),
    (dict(max_num_seqs=10**9), "max_num_seqs"),
    (dict(block_size=3), "block_size"),
    (dict(num_kv_blocks=10**12), "needs .* GiB of KV cache"),
    (dict(kv_cache_gib=float("nan")), "kv_cache_gib"),
    (dict(kv_cache_gib=-1.0), "kv_cache_gib"),  # a large one is only a cap: the pool stops at what max_num_seqs needs
    (dict(max_model_len=1), "max_model_len"),
    (dict(seed=-5), "seed"),
])
def test_engine_sizes_are_checked_before_anything_is_allocated(tiny_target, tiny_draft, kwargs, match):
    kwargs = {"num_speculative_tokens": 3, **kwargs}
    k = kwargs.pop("num_speculative_tokens")
    with pytest.raises(ConfigError, match=match):
        tiny_llm(tiny_target, tiny_draft, k=k, **kwargs)


@pytest.mark.parametrize("change, match", [
    (dict(vocab_size=0), "vocab_size"),
    (dict(hidden_size=-64), "hidden_size"),
    (dict(rope_theta=0), "rope_theta"),
    (dict(rms_norm_eps=-1e-6), "rms_norm_eps"),
    (dict(max_position_embeddings=10**9), "max_position_embeddings"),
    (dict(num_hidden_layers=2.5), "num_hidden_layers"),
    (dict(head_dim=15), "head_dim"),
    (dict(num_key_value_heads=3), "multiple of"),
], ids=lambda v: str(v)[:30])
def test_impossible_architectures_are_refused_with_the_file_named(tmp_path, change, match):
    path = write_config(tmp_path / "model", dict(TARGET_CFG, **change))
    with pytest.raises(ModelLoadError, match=match) as info:
        tiny_llm(path)
    assert "config.json" in str(info.value)


def test_corrupt_configs_name_the_file_and_the_problem(tmp_path):
    bad_json = tmp_path / "bad_json"
    bad_json.mkdir()
    (bad_json / "config.json").write_text('{"hidden_size": 64,')
    with pytest.raises(ModelLoadError, match="config.json: not valid JSON"):
        tiny_llm(str(bad_json))
    missing = write_config(tmp_path / "missing", {k: v for k, v in TARGET_CFG.items() if k != "hidden_size"})
    with pytest.raises(ModelLoadError, match="missing the key 'hidden_size'"):
        tiny_llm(missing)
    array = tmp_path / "array"
    array.mkdir()
    (array / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelLoadError, match="expected a JSON object"):
        tiny_llm(str(array))


def _saved_checkpoint(tmp_path, cfg=DRAFT_CFG):
    from safetensors.torch import save_file

    from protospec.model.loader import init_dummy_weights
    from protospec.model.llama import LlamaForCausalLM
    from protospec.model.config import LlamaArchConfig

    model = LlamaForCausalLM(LlamaArchConfig.from_dict(cfg))
    init_dummy_weights(model, 0)
    path = tmp_path / "ckpt"
    write_config(path, cfg)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if "rotary" not in k and "rope" not in k}
    save_file(state, str(path / "model.safetensors"))
    return path


def test_truncated_weights_name_the_file(tmp_path):
    path = _saved_checkpoint(tmp_path)
    weights = path / "model.safetensors"
    assert len(tiny_llm(str(path), load_format="auto").generate(random_prompts(1), GREEDY)[0].token_ids) == 10
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors: cannot read the weights"):
        tiny_llm(str(path), load_format="auto")


def test_weights_that_do_not_match_the_config_are_named(tmp_path):
    path = _saved_checkpoint(tmp_path)
    (path / "config.json").write_text(json.dumps(dict(DRAFT_CFG, intermediate_size=96)))
    with pytest.raises(ModelLoadError, match="do not match config.json's shapes"):
        tiny_llm(str(path), load_format="auto")


def test_cli_output_paths_are_checked_before_the_run(tiny_target, tmp_path):
    from protospec.bench.cli import main

    with pytest.raises(SystemExit, match="does not exist"):
        main(["--model", tiny_target, "--load-format", "dummy", "--output-json", str(tmp_path / "no" / "dir" / "r.json")])


def test_evaluate_names_a_missing_pair(tmp_path):
    from protospec.train.evaluate import main

    with pytest.raises(SystemExit, match="no protospec-target/config.json"):
        main(["--models", str(tmp_path)])


def test_a_thousand_requests_leak_nothing(llm, reference):
    """1,000 short requests in batches of 50, mixed greedy and sampled: the pool returns to full and
    a probe request's greedy tokens never change."""
    bm = llm.engine.block_manager
    for batch in range(20):
        params = [SamplingParams(temperature=float(i % 2), max_tokens=1 + (i + batch) % 4, ignore_eos=True, seed=i)
                  for i in range(50)]
        outs = llm.generate(random_prompts(50, lengths=(3, 7, 5), seed=batch), params)
        assert [len(o.token_ids) for o in outs] == [p.max_tokens for p in params]
        assert bm.num_free_blocks == bm.num_usable_blocks
    _still_serves(llm, reference)


@pytest.mark.parametrize("draft", [False, True], ids=["target_only", "speculative"])
def test_a_temperature_too_small_to_divide_by_samples_greedily(tiny_target, tiny_draft, draft):
    """logits / 1e-45 overflow float32: every probability NaN and every token 0, once. Below
    GREEDY_BELOW a temperature means greedy, as in vLLM."""
    from protospec.config import GREEDY_BELOW

    llm = tiny_llm(tiny_target, tiny_draft if draft else None, k=3)
    tiny = [o.token_ids for o in llm.generate(random_prompts(2), SamplingParams(temperature=1e-45, max_tokens=10,
                                                                                ignore_eos=True))]
    assert tiny == [o.token_ids for o in llm.generate(random_prompts(2), GREEDY)] and set(tiny[0]) != {0}
    assert SamplingParams(temperature=GREEDY_BELOW / 2).greedy and not SamplingParams(temperature=GREEDY_BELOW).greedy


def test_numpy_numbers_in_sampling_params_are_python_numbers(llm):
    params = SamplingParams(temperature=np.float32(0.7), top_k=np.int64(20), max_tokens=np.int64(10),
                            ignore_eos=np.bool_(True), seed=np.int64(3))
    assert type(params.seed) is int and type(params.max_tokens) is int and type(params.temperature) is float
    plain = SamplingParams(temperature=float(np.float32(0.7)), top_k=20, max_tokens=10, ignore_eos=True, seed=3)
    assert [o.token_ids for o in llm.generate(random_prompts(2), params)] == \
        [o.token_ids for o in llm.generate(random_prompts(2), plain)]


@pytest.mark.parametrize("kwargs, match", [
    (dict(model=None), "model must be a Hugging Face hub id or a checkpoint directory"),
    (dict(model=""), "model must be"),
    (dict(speculative_model=3), "speculative_model must be"),
    (dict(device="meta"), "the engine runs on cpu or cuda devices"),
    (dict(device="gpu0"), "device must be 'auto', 'cpu', 'cuda' or 'cuda:N'"),
], ids=lambda v: str(v)[:24])
def test_engine_arguments_that_name_no_model_or_device_are_refused(kwargs, match):
    from protospec.config import EngineConfig

    with pytest.raises(ConfigError, match=match):
        EngineConfig(**{"model": "m", **kwargs})


def test_max_model_len_past_the_models_length_is_refused_not_cut(tiny_target, tiny_draft):
    with pytest.raises(ConfigError, match=r"max_model_len=1000000000 is longer than the model's max_position_embeddings \(256"):
        tiny_llm(tiny_target, tiny_draft, max_model_len=10**9)
    assert tiny_llm(tiny_target, max_model_len=100).engine.max_model_len == 100


def test_an_output_path_that_is_a_directory_is_refused_before_the_run(tiny_target, tmp_path):
    from protospec.bench.cli import main

    with pytest.raises(SystemExit, match="it is a directory; give a file path"):
        main(["--model", tiny_target, "--load-format", "dummy", "--output-json", str(tmp_path)])


def test_evaluate_checks_where_it_would_write_the_prompts_before_loading(tmp_path):
    from protospec.train.evaluate import main

    with pytest.raises(SystemExit, match="does not exist"):
        main(["--prompts-json", str(tmp_path / "missing" / "p.json")])
