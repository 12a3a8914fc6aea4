"""The step debugger the notebooks use: GPU-advance inputs equal their CPU prepare twin at every
draft step, verdicts match what was emitted, and the engine goes on correctly afterwards."""
import pytest
import torch
from tiny import random_prompts, tiny_llm

from protospec import SamplingParams
from protospec.lab.debug import DraftLoopDebugger
from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE
from protospec.lab.viz import plot_block_pool

DEV = KERNEL_DEVICE_TYPE  # the gpu mode's advance_step runs here: cuda on a GPU machine, cpu in the simulator


def test_debugger_records_every_draft_step_and_its_cpu_twin(tiny_target, tiny_draft):
    llm = tiny_llm(tiny_target, tiny_draft, k=4, draft_loop="gpu", block_size=4, device=DEV)
    dbg = DraftLoopDebugger(llm)
    seqs = dbg.add(random_prompts(2), SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True, seed=3))
    for _ in range(3):
        lengths = [s.num_tokens for s in seqs]
        trace = dbg.spec_step()
        assert [d.path for d in trace.draft_steps] == ["cpu_prepare"] + ["gpu_advance"] * 3
        for d in trace.draft_steps:
            assert d.differences == {"input_ids": 0, "positions": 0, "seq_lens": 0, "slot_mapping": 0}, d.step
        assert trace.counters["draft"]["gpu_advance"] == 3
        for seq, before, row in zip(seqs, lengths, trace.verdicts):
            emitted = [v["emitted"] for v in row if v["emitted"] != -1]
            assert seq.output_token_ids[before - len(seq.prompt_token_ids):] == emitted
            accepted = sum(v["verdict"] == "accepted" for v in row)
            assert row[accepted]["kind"] in ("recovered", "bonus")
        assert len(trace.written_slots["target"]) == 2 * 5 and len(trace.written_slots["draft"]) >= 2 * 4
    fig = plot_block_pool(llm.engine.num_blocks, 4, trace.block_tables, trace.written_slots, max_blocks=24)
    assert fig.axes[0].get_title().startswith("KV block pool")


def test_stage_by_stage_stepping_generates_what_generate_does(tiny_target, tiny_draft):
    params = SamplingParams(temperature=1.0, max_tokens=24, ignore_eos=True, seed=9)
    prompts = random_prompts(2, seed=4)
    reference = [o.token_ids for o in tiny_llm(tiny_target, tiny_draft, k=3, draft_loop="gpu", device=DEV).generate(prompts, params)]
    dbg = DraftLoopDebugger(tiny_llm(tiny_target, tiny_draft, k=3, draft_loop="gpu", device=DEV))
    seqs = dbg.add(prompts, params)
    while dbg.engine.running:
        dbg.begin()
        first = dbg.draft_step()
        assert first.step == 0 and first.path == "cpu_prepare" and dbg.state.step == 1
        second = dbg.draft_step()
        assert second.path == "gpu_advance" and second.differences["slot_mapping"] == 0
        probs = dbg.verify()  # runs the remaining draft step first
        assert dbg.state.step == 3 and tuple(probs.shape) == (len(dbg.state.seqs), 4, 256)
        verdicts = dbg.reject()
        assert len(verdicts) == len(dbg.state.seqs)
        dbg.commit()
    assert [s.output_token_ids for s in seqs] == reference


def test_debugger_shows_the_overlapped_commits_device_built_first_step(tiny_target, tiny_draft):
    """commit(overlap=True) launches the next draft step 1 as generate() does; its inputs, built on
    the device from the rejection output, equal the CPU twin built after the commit, and the next
    step continues from it. The tokens are generate()'s."""
    params = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True, seed=5)
    prompts = random_prompts(2, seed=6)
    reference = [o.token_ids for o in tiny_llm(tiny_target, tiny_draft, k=3, draft_loop="gpu", device=DEV).generate(prompts, params)]
    dbg = DraftLoopDebugger(tiny_llm(tiny_target, tiny_draft, k=3, draft_loop="gpu", device=DEV, block_size=4))
    seqs = dbg.add(prompts, params)
    launched = 0
    while dbg.engine.running:
        had_launch = dbg._launched is not None
        trace = dbg.spec_step(overlap=True)
        paths = [d.path for d in trace.draft_steps]
        assert paths == (["gpu_first_step"] if had_launch else ["cpu_prepare"]) + ["gpu_advance"] * 2
        for d in trace.draft_steps:
            assert d.differences == {"input_ids": 0, "positions": 0, "seq_lens": 0, "slot_mapping": 0}, d.path
        if trace.next_first_step is not None:
            launched += 1
            assert trace.next_first_step.differences == {"input_ids": 0, "positions": 0, "seq_lens": 0, "slot_mapping": 0}
    assert launched > 3 and "first_step_discarded" not in dbg.engine.draft.counters
    assert [s.output_token_ids for s in seqs] == reference


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the graph mode replays CUDA graphs")
@pytest.mark.parametrize("step_graph", [False, None], ids=["stage_by_stage", "step_graph"])
def test_debugger_follows_the_graph_modes_launched_steps(tiny_target, tiny_draft, step_graph, monkeypatch):
    """In the graph mode a launched step arrives with its whole draft loop (or, with the step graph,
    its verify and rejection too) already run: the trace still shows its device-built draft step 1
    against the CPU twin, the step's probabilities are the step's (the step graph, here forming them
    from the logits at every batch, writes none: made on request; the greedy request's tokens are their
    argmax), and the tokens are generate()'s."""
    from protospec.speculation import step_graph as step_graph_module

    monkeypatch.setattr(step_graph_module, "LOGITS_MIN_ROWS", 1)
    params = [SamplingParams(temperature=t, max_tokens=30, ignore_eos=True, seed=5) for t in (0.0, 1.0)]
    prompts = random_prompts(2, seed=6)
    kw = dict(k=3, draft_loop="graph", device="cuda", block_size=4, spec_step_graph=step_graph)
    reference = [o.token_ids for o in tiny_llm(tiny_target, tiny_draft, **kw).generate(prompts, params)]
    dbg = DraftLoopDebugger(tiny_llm(tiny_target, tiny_draft, **kw))
    seqs = dbg.add(prompts, params)
    launched = 0
    while dbg.engine.running:
        had_launch = dbg._launched is not None
        dbg.begin()
        target, draft = dbg.verify(), dbg.state.draft_probs  # [B, k + 1, V], [B, k, V]
        for probs in (target, draft):
            assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-3) and probs.min() >= 0
        dbg.reject()
        for row in [i for i, seq in enumerate(dbg.state.seqs) if seq.params.temperature == 0.0]:
            n, emitted = dbg.state.result.num_accepted[row].item(), dbg.state.result.output_token_ids[row]
            assert torch.equal(draft[row].argmax(-1), dbg.state.draft_ids[row])
            assert torch.equal(target[row, : n + 1].argmax(-1), emitted[: n + 1])
        trace = dbg.commit(overlap=True)
        assert [d.path for d in trace.draft_steps] == (["gpu_first_step"] if had_launch else ["cpu_prepare"])
        for d in trace.draft_steps:
            assert d.differences == {"input_ids": 0, "positions": 0, "seq_lens": 0, "slot_mapping": 0}, d.path
        launched += trace.next_first_step is not None
    assert launched > 3
    assert [s.output_token_ids for s in seqs] == reference


def test_debugger_refuses_an_overlap_the_mode_cannot_do(tiny_target, tiny_draft):

    dbg = DraftLoopDebugger(tiny_llm(tiny_target, tiny_draft, k=3, draft_loop="main"))
    dbg.add(random_prompts(1), SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
    dbg.begin()
    with pytest.raises(ValueError, match="overlap_commit"):
        dbg.commit(overlap=True)
