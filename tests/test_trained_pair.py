"""The committed pair of record (data/models): its sizes, and acceptance on the fixed held-out prompt
set staying near the figure recorded on the H200 (data/results/...trained_pair.json). A broken draft
cache, a misaligned verify window or a sampler bug drags acceptance down, and this test catches it."""
import json
from pathlib import Path

from protospec.model.config import LlamaArchConfig
from protospec.train.evaluate import fixed_prompts, measure
from protospec.train.trainer import macs_per_token

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "data" / "models"
RECORD = ROOT / "data" / "results" / "2026-11-30_nvidia-h200_trained_pair.json"
MARGIN = 0.03  # CPU float32 against H200 float16 on the same prompts: near-ties may flip a few argmaxes


def test_pair_sizes_on_disk_and_cost_per_token():
    total = sum(f.stat().st_size for f in MODELS.glob("protospec-*/*") if f.is_file())
    assert total <= 16e6, f"the pair takes {total / 1e6:.1f} MB"
    target, draft = (LlamaArchConfig.from_json(MODELS / name / "config.json") for name in ("protospec-target", "protospec-draft"))
    assert target.vocab_size == draft.vocab_size
    ratio = macs_per_token(target, target.vocab_size) / macs_per_token(draft, draft.vocab_size)
    assert ratio >= 4, f"the draft is only {ratio:.1f}x cheaper per token"


def test_greedy_acceptance_on_fixed_heldout_prompts_matches_the_record():
    record = json.loads(RECORD.read_text())["evaluate_fixed_prompts"]
    prompts = fixed_prompts(MODELS / "heldout_prompts.json", None, record["num_prompts"], record["prompt_len"])
    got = measure(str(MODELS / "protospec-target"), str(MODELS / "protospec-draft"), record["k"], prompts,
                  record["max_tokens"], 0.0, device="cpu", dtype="float32", max_num_seqs=len(prompts))
    recorded = record["greedy"]
    for rate in ("acceptance_rate", "prefix_acceptance_rate"):
        assert abs(got[rate] - recorded[rate]) <= MARGIN, f"{rate} {got[rate]:.3f} vs recorded {recorded[rate]:.3f}"
    assert got["acceptance_rate"] >= 0.5  # the bar, greedy at k = 5
