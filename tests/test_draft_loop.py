"""The three draft-loop modes (main, sampler, gpu): which path ran, same outputs, no host sync."""
import contextlib

import pytest
import torch
from tiny import random_prompts, tiny_llm

from protospec import ConfigError, SamplingParams
from protospec.speculation.sync_guard import HostSyncError, forbid_host_sync

from protospec.kernels.launch.interop import KERNEL_DEVICE_TYPE  # noqa: E402
from protospec.speculation.device_draft_loops import DeviceAdvanceLoop  # noqa: E402

KERNEL_DEVICES = [KERNEL_DEVICE_TYPE]  # "gpu" mode: cuda on a GPU machine, cpu in the simulator
ON_GPU = KERNEL_DEVICE_TYPE == "cuda"
NO_SYNC_MODES = ["sampler", "gpu"] + (["graph"] if ON_GPU else [])  # graph mode needs CUDA graphs
GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)


def _llm(target, draft, device, mode, k=4, **kw):
    # On CPU the "gpu" mode runs the Numba kernel in the CUDA simulator.
    return tiny_llm(target, draft, k=k, device=device, draft_loop=mode, **kw)


def _device_param(device):
    return pytest.param(device, marks=[pytest.mark.gpu] if device == "cuda" else [])


@pytest.mark.parametrize("device", [_device_param(d) for d in KERNEL_DEVICES])
def test_gpu_path_advances_k_minus_1_times_per_spec_step(tiny_target, tiny_draft, device):
    llm = _llm(tiny_target, tiny_draft, device, "gpu", k=4, check_no_sync=True)
    llm.generate(random_prompts(4), GREEDY)
    steps = llm.metrics.num_spec_steps  # summed over the batch; spec steps of the engine:
    engine_steps = llm.counters["target"]["cpu_prepare:verify"]
    draft = llm.counters["draft"]
    assert engine_steps > 0 and steps >= engine_steps
    assert draft["gpu_advance"] == 3 * engine_steps
    # Draft step 1: built on the device by the previous commit (overlapped). After a prefill and where
    # a request may end within the step nobody launched it ahead: then it is built on the device at the
    # step's start, never on the CPU; none discarded (ignore_eos, one batch).
    assert "cpu_prepare:first_draft_step" not in draft and draft["first_step_at_begin"] > 0
    assert draft["gpu_first_step"] == engine_steps and "first_step_discarded" not in draft
    assert draft["cpu_prepare"] == draft["cpu_prepare:prefill"]
    assert not any(key.startswith("fallback:") for key in draft)


@pytest.mark.parametrize("device", [_device_param(d) for d in KERNEL_DEVICES])
def test_gpu_path_off_never_runs_the_kernel_and_gives_the_same_greedy_output(tiny_target, tiny_draft, device):
    prompts = random_prompts(4)
    expected = [o.token_ids for o in _llm(tiny_target, tiny_draft, device, "gpu").generate(prompts, GREEDY)]
    for mode in ("main", "sampler"):
        off = _llm(tiny_target, tiny_draft, device, mode)
        assert [o.token_ids for o in off.generate(prompts, GREEDY)] == expected, mode
        assert not isinstance(off.engine.spec_step.draft_loop, DeviceAdvanceLoop)  # no buffers, no bound kernel: it cannot run
        draft = off.counters["draft"]
        steps = off.counters["target"]["cpu_prepare:verify"]
        assert "gpu_advance" not in draft and draft["fallback:disabled_by_user"] == 3 * steps, mode


@pytest.mark.parametrize("device", [_device_param(d) for d in KERNEL_DEVICES])
@pytest.mark.parametrize("mode", ["main", *NO_SYNC_MODES])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_equal_to_target_accepts_everything_on_every_path(tiny_target, device, mode, temperature):
    llm = _llm(tiny_target, tiny_target, device, mode, k=5)
    params = SamplingParams(temperature=temperature, max_tokens=64, ignore_eos=True, seed=1)
    llm.generate(random_prompts(4, seed=9), params)
    assert llm.metrics.acceptance_rate == 1.0


@pytest.mark.parametrize("device", [_device_param(d) for d in KERNEL_DEVICES])
def test_seeded_sampling_is_identical_across_the_three_paths(tiny_target, tiny_draft, device):
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, max_tokens=40, ignore_eos=True, seed=123)
    outs = {m: [o.token_ids for o in _llm(tiny_target, tiny_draft, device, m).generate(random_prompts(3), params)]
            for m in ("main", *NO_SYNC_MODES)}
    assert all(outs[m] == outs["main"] for m in NO_SYNC_MODES)


@pytest.mark.parametrize("device", [_device_param(d) for d in KERNEL_DEVICES])
@pytest.mark.parametrize("mode", NO_SYNC_MODES)
def test_no_sync_paths_pass_the_guard_and_the_guard_can_trip(tiny_target, tiny_draft, mode, device):
    llm = _llm(tiny_target, tiny_draft, device, mode, check_no_sync=True)
    llm.generate(random_prompts(2), SamplingParams(temperature=1.0, max_tokens=20, seed=0))
    with pytest.raises(HostSyncError):
        with forbid_host_sync(torch.device("cpu")):
            torch.ones(2).sum().item()
    # and the main path, which syncs every draft step, trips it
    main = _llm(tiny_target, tiny_draft, "cpu", "main")
    main.engine.spec_step.loop_guard = forbid_host_sync
    with pytest.raises(HostSyncError, match="tolist"):
        main.generate(random_prompts(1), GREEDY)
    main.engine.spec_step.loop_guard = lambda device: contextlib.nullcontext()
    assert main.generate(random_prompts(1), GREEDY)  # and the engine is still usable


def test_check_no_sync_with_the_main_path_is_refused(tiny_target, tiny_draft):
    with pytest.raises(ConfigError, match="check_no_sync"):
        _llm(tiny_target, tiny_draft, "cpu", "main", check_no_sync=True)


def test_auto_picks_main_on_a_cpu_and_names_the_reason(tiny_target, tiny_draft):
    llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cpu")
    llm.generate(random_prompts(1), GREEDY)
    assert llm.engine.draft_loop == "main"
    assert llm.counters["draft"]["fallback:no_cuda_device"] > 0


def test_auto_picks_the_fastest_way_the_device_allows():
    from protospec import registry
    assert registry.resolve("auto", "cuda", cuda_graphs=True) == ("graph", "")
    assert registry.resolve("auto", "cuda", cuda_graphs=False) == ("gpu", "")
    assert registry.resolve("auto", "cpu", cuda_graphs=False) == ("main", "no_cuda_device")
    assert registry.resolve("gpu", "cuda", cuda_graphs=True) == ("gpu", "disabled_by_user")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_on_cuda_replays_the_draft_loop_as_a_graph(tiny_target, tiny_draft):
    llm = tiny_llm(tiny_target, tiny_draft, k=3, device="cuda")
    llm.generate(random_prompts(2), GREEDY)
    assert llm.engine.draft_loop == "graph"
    assert llm.counters["draft"]["draft_loop_graph"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["main", "gpu"])
def test_cuda_graph_replays_give_the_eager_tokens(tiny_target, tiny_draft, mode):
    prompts = random_prompts(3)
    params = SamplingParams(temperature=1.0, max_tokens=40, ignore_eos=True, seed=5)
    outs = {}
    for graphs in (False, True):
        llm = _llm(tiny_target, tiny_draft, "cuda", mode, cuda_graphs=graphs)
        outs[graphs] = [o.token_ids for o in llm.generate(prompts, params)]
        counters = llm.counters
    assert outs[True] == outs[False]
    assert counters["draft"]["forward:graph"] > 0 and counters["target"]["forward:graph"] > 0
    assert counters["target"]["forward:eager"] == 1  # the prefill only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("step_graph", [False, None], ids=["stage_by_stage", "step_graph"])
def test_graph_mode_replays_the_whole_draft_tail(tiny_target, tiny_draft, step_graph):
    llm = _llm(tiny_target, tiny_draft, "cuda", "graph", k=4, check_no_sync=True, spec_step_graph=step_graph)
    llm.generate(random_prompts(4), SamplingParams(temperature=1.0, max_tokens=48, ignore_eos=True, seed=2))
    draft = llm.counters["draft"]
    whole = draft.get("spec_step_graph", 0)  # a step graph builds its verify's inputs itself
    steps = llm.counters["target"].get("cpu_prepare:verify", 0) + whole
    assert (whole > 0) == (step_graph is None)
    # Stage by stage, a draft step 1 built on the device joins the replay of steps 2..k.
    assert (draft.get("draft_loop_graph:from_first_step", 0) > 0) == (step_graph is False)
    assert draft["draft_loop_graph"] == steps and draft["gpu_advance"] == 3 * steps
    # By default every draft step 1 is built on the device, the ones nobody launched ahead at the step's start.
    assert draft["gpu_first_step"] == steps and draft["first_step_at_begin"] > 0
    assert "cpu_prepare:first_draft_step" not in draft
    assert not any(key.startswith("fallback:") for key in draft)
