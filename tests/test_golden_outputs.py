"""Seeded outputs of every draft-loop way, pinned: a refactor of the draft loop must not change a token.

The pinned tokens come from tiny float64 models (dummy weights from a fixed seed), so they do not hang
on float ties that differ between CPUs. k = 1 is pinned too: there the device ways build draft step
1 only (no step to advance). Regenerate only on purpose, after a change that is
meant to alter outputs:  python tests/test_golden_outputs.py --write
"""
import json
import sys
from pathlib import Path

import pytest
from tiny import DRAFT_CFG, TARGET_CFG, random_prompts, tiny_llm, write_config

from protospec import SamplingParams
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE

GOLDEN = Path(__file__).parent / "golden" / "draft_loop_outputs.json"
# (draft loop, overlap_commit): the device ways run where the kernels do (the simulator on a CPU).
WAYS = [("main", False), ("sampler", False)] + ([("gpu", False), ("gpu", True)] if KERNEL_DEVICE_TYPE == "cpu" else [])
PARAMS = {
    "greedy": SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True),
    "seeded_t1": SamplingParams(temperature=1.0, max_tokens=14, ignore_eos=True, seed=7),
    "seeded_filtered": SamplingParams(temperature=0.8, top_k=40, top_p=0.9, max_tokens=11, ignore_eos=True, seed=11),
}


def _outputs(tmp: Path, way: tuple[str, bool]) -> dict[str, list[list[int]]]:
    target = write_config(tmp / "target", TARGET_CFG)
    draft = write_config(tmp / "draft", DRAFT_CFG)
    prompts = random_prompts(3, seed=5)
    out = {}
    for k in (3, 1):
        llm = tiny_llm(target, draft, k=k, dtype="float64", device="cpu", draft_loop=way[0], overlap_commit=way[1])
        for name, params in PARAMS.items():
            out[f"k{k}_{name}"] = [o.token_ids for o in llm.generate(prompts, params)]
    return out


def _key(way: tuple[str, bool]) -> str:
    return f"{way[0]}{'+overlap' if way[1] else ''}"


@pytest.mark.parametrize("way", WAYS, ids=_key)
def test_seeded_outputs_match_the_pinned_tokens(tmp_path, way):
    pinned = json.loads(GOLDEN.read_text())
    assert _outputs(tmp_path, way) == pinned


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    from protospec.kernels.launch.simulator import choose_numba_cuda_target

    choose_numba_cuda_target()
    with tempfile.TemporaryDirectory() as tmp:
        results = {_key(w): _outputs(Path(tmp) / _key(w), w) for w in [("main", False), ("sampler", False), ("gpu", False), ("gpu", True)]}
    first = next(iter(results.values()))
    assert all(r == first for r in results.values()), "the ways disagree: fix that before pinning"
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in first.items()) + "\n}\n")
    print(f"wrote {GOLDEN}")
