"""python -m protospec.train on a smoke-sized run: the saved pair loads alike through transformers and
protospec, text prompts work end to end, and speculative greedy output equals target-only output."""
import json
from pathlib import Path

import pytest
import torch

from protospec import LLM, SamplingParams
from protospec.train.__main__ import main as train_main
from protospec.train.corpus import Corpus, is_heldout
from protospec.train.evaluate import heldout_prompts
from protospec.model.config import LlamaArchConfig
from protospec.train.trainer import DRAFT_SIZE, TARGET_SIZE, llama_config, macs_per_token


PAIR_OF_RECORD = Path(__file__).resolve().parents[1] / "data" / "models"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("pair")
    report = train_main(["--out", str(out), "--max-files", "30", "--steps", "25", "--batch-size", "4",
                         "--context", "64", "--vocab-size", "512", "--eval-every", "10", "--teacher-samples", "6",
                         "--device", "cpu", "--max-minutes", "120"])  # steps, not a loaded host's clock, end it
    return out, report


def test_heldout_split_is_fixed_and_disjoint():
    corpus = Corpus.from_stdlib()
    assert not set(corpus.train_files) & set(corpus.heldout_files)
    share = len(corpus.heldout_files) / (len(corpus.train_files) + len(corpus.heldout_files))
    assert 0.02 < share < 0.09
    assert is_heldout("json/decoder.py") == is_heldout("json/decoder.py")


def test_report_and_sizes(pair):
    out, report = pair
    saved = json.loads((out / "train_report.json").read_text())
    assert saved["models"].keys() == {"protospec-target", "protospec-draft"}
    for stats in saved["models"].values():
        assert stats["steps"] == 25 and stats["heldout_loss"] > 0
        assert stats["best_step"] in (10, 20)  # early stopping keeps an evaluated checkpoint
    assert saved["teacher_samples"]["sequences"] == 6 and saved["teacher_samples"]["tokens"] == 6 * 65
    assert saved["models"]["protospec-draft"]["train_config"]["sampled_fraction"] == 0.5
    # The pair of record's sizes: two fp16 checkpoints within 16 MB, the draft >= 4x cheaper per token.
    params = [LlamaArchConfig.from_dict(llama_config(size, 4096).to_dict()).num_parameters for size in (TARGET_SIZE, DRAFT_SIZE)]
    assert 2 * sum(params) + 2 * 300_000 < 16e6  # fp16 weights + two tokenizer files
    assert macs_per_token(TARGET_SIZE, 4096) >= 4 * macs_per_token(DRAFT_SIZE, 4096)
    # and what the smoke run wrote matches its own config's parameter count
    for name in ("protospec-target", "protospec-draft"):
        arch = LlamaArchConfig.from_json(out / name / "config.json")
        assert saved["models"][name]["parameters"] == arch.num_parameters


@pytest.fixture(params=["smoke", "of_record"])
def pair_dir(request, pair):
    """The pair a smoke run just wrote, and the committed pair of record."""
    return pair[0] if request.param == "smoke" else PAIR_OF_RECORD


def test_transformers_and_protospec_give_the_same_greedy_text(pair_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = pair_dir
    target = out / "protospec-target"
    tok = AutoTokenizer.from_pretrained(target)
    hf = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    ids = tok("def __init__(self", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        hf_ids = hf.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist()
    llm = LLM(str(target), dtype="float32", device="cpu")
    result = llm.generate("def __init__(self", SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    assert result.token_ids == hf_ids
    assert isinstance(result.text, str) and result.text == tok.decode(hf_ids)


def test_speculative_greedy_equals_target_only_on_heldout_prompts(pair_dir):
    out = pair_dir
    target, draft = str(out / "protospec-target"), str(out / "protospec-draft")
    alone = LLM(target, dtype="float32", device="cpu")
    prompts = heldout_prompts(alone.tokenizer, num_prompts=3, prompt_len=24)
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    spec = LLM(target, speculative_model=draft, num_speculative_tokens=5, dtype="float32", device="cpu")
    assert [o.token_ids for o in spec.generate(prompts, params)] == [o.token_ids for o in alone.generate(prompts, params)]


def test_distillation_loss_is_zero_only_for_the_teachers_distribution():
    from protospec.train.trainer import distillation_loss

    teacher = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(0))
    assert distillation_loss(teacher.clone(), teacher).abs().item() < 1e-6
    assert distillation_loss(teacher + 3.0, teacher).abs().item() < 1e-5  # a constant shift: same softmax
    assert distillation_loss(torch.zeros_like(teacher), teacher).item() > 0.05


def test_teacher_samples_continue_corpus_prompts():
    """Greedy batches are the teacher's argmax continuation of a corpus window; sampled ones differ."""
    import numpy as np
    from transformers import LlamaForCausalLM

    from protospec.train.trainer import ModelSize, sample_from_teacher

    torch.manual_seed(0)
    teacher = LlamaForCausalLM(llama_config(ModelSize(32, 1, 2, 64), 50)).eval()
    tokens = np.random.default_rng(0).integers(3, 50, 5000).astype(np.uint16)
    samples = sample_from_teacher(teacher, tokens, num_seqs=6, prompt_len=8, length=20, device=torch.device("cpu"),
                                  seed=0, batch_size=3)  # batch 0 greedy, batch 1 sampled
    assert samples.shape == (6, 20) and samples.dtype == torch.int64
    stream = tokens.tobytes()
    for row in samples:  # every prompt is a window of the corpus
        assert np.asarray(row[:8], dtype=np.uint16).tobytes() in stream
    with torch.no_grad():
        greedy = teacher.generate(samples[:3, :8], max_new_tokens=12, do_sample=False, pad_token_id=1)
    assert torch.equal(greedy, samples[:3])
    with torch.no_grad():
        argmax_of_sampled = teacher.generate(samples[3:, :8], max_new_tokens=12, do_sample=False, pad_token_id=1)
    assert not torch.equal(argmax_of_sampled, samples[3:])
