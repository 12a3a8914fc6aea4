"""The ablation: the draft-loop modes and the peers, in one process, on the same prompts and seeds.

modes   the arms of registry.ARMS (a draft loop and a commit policy each; graph needs CUDA): one
        engine (same weights, KV pool and CUDA graphs), switched between generate() calls with
        Engine.set_draft_loop. gpu_sync_commit is vLLM's change as it was (draft step 1 CPU-prepared
        after the commit's host sync); gpu and graph also build draft step 1 on the device and overlap
        the commit (speculation/commit.py)
peers   target_only     protospec without a draft (several decode steps per CUDA graph replay on a GPU);
                        with several rounds it runs in each, after the modes, and the report gives
                        p50(target_only) / p50(fastest mode) per round
        hf_static_loop  transformers' Llama with a StaticCache, its forward compiled (reduce-overhead:
                        CUDA graphs), a hand-written decode loop sampling on the device (gpt-fast's form)
        hf_assisted     transformers generate(assistant_model=draft), constant k, same weights
        hf_target_only  transformers generate() of the target alone
        hf_compiled     the same with a static KV cache, which makes generate() compile the forward with
                        torch.compile on CUDA (warmed up, so compiled, before the timed iterations)
        unfused         the fastest mode again with the fusion off (linear_kernel="cublas": cuBLAS GEMMs
                        and separate norm, RoPE and SiLU kernels): the fused linears' share of the speed-up
"""
from __future__ import annotations

import gc
from dataclasses import asdict, dataclass, replace

import numpy as np
import torch

from protospec.bench.hf_peer import HFGenerate, HFStaticLoop, compiled_graph_count, to_hf
from protospec.bench.latency import LatencyResult, random_prompts, time_calls, time_generate
from protospec.bench.report import BASELINE, PEER_NAMES, fastest_mode
from protospec.config import SamplingParams
from protospec.errors import ConfigError
from protospec.engine.llm import LLM
from protospec.requests.metrics import RATE_KEYS
from protospec import registry
from protospec.speculation.phase_timer import NULL_TIMER, PhaseTimer

MODES = tuple(registry.ARMS)  # the ablation's arms, in table order
PEERS = PEER_NAMES


@dataclass
class BenchSetup:
    model: str
    speculative_model: str | None
    num_speculative_tokens: int
    input_len: int
    output_len: int
    batch_size: int
    num_iters_warmup: int
    num_iters: int
    dtype: str = "auto"
    block_size: int = 16
    load_format: str = "auto"
    seed: int = 0
    temperature: float = 1.0
    device: str | None = None
    layer_kernels: bool | None = None  # None: the engine's default (on CUDA)
    enforce_eager: bool = False        # no CUDA graphs
    max_model_len: int | None = None   # None: the target's max_position_embeddings
    acceptance: str = registry.REJECTION  # speculation/acceptance.py
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    prompt_lookup_min: int = 1         # the n-gram proposer (speculative_model "[ngram]")
    prompt_lookup_max: int = 4
    speculative_disable_by_batch_size: int | None = None
    linear_kernel: str | None = None       # EngineConfig.linear_kernel (None: mma_fused with the layer kernels)
    fused_sampling: bool | None = None     # EngineConfig.fused_sampling (None: on a GPU with the layer kernels)
    dependent_launch: bool | None = None   # EngineConfig.dependent_launch (None: wherever it applies)
    spec_step_graph: bool | None = None    # EngineConfig.spec_step_graph (None: wherever it applies)
    prefill_kernels: bool | None = None    # EngineConfig.prefill_kernels (None: on a GPU)
    kv_cache_gib: float | None = None  # None: the engine's default pool (EngineConfig.kv_cache_gib)

    def prompts(self, vocab_size: int) -> list[list[int]]:
        return random_prompts(self.batch_size, self.input_len, self.seed, vocab_size)

    def params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, max_tokens=self.output_len, ignore_eos=True, seed=self.seed)

    def llm(self, speculative: bool = True, draft_loop: str = registry.AUTO) -> LLM:
        draft = self.speculative_model if speculative else None
        return LLM(self.model, speculative_model=draft, num_speculative_tokens=self.num_speculative_tokens,
                   load_format=self.load_format, dtype=self.dtype, device=self.device, block_size=self.block_size,
                   seed=self.seed, max_num_seqs=self.batch_size, draft_loop=draft_loop,
                   layer_kernels=self.layer_kernels, cuda_graphs=False if self.enforce_eager else None,
                   max_model_len=self.max_model_len, kv_cache_gib=self.kv_cache_gib, acceptance=self.acceptance,
                   posterior_threshold=self.posterior_threshold, posterior_alpha=self.posterior_alpha,
                   prompt_lookup_min=self.prompt_lookup_min, prompt_lookup_max=self.prompt_lookup_max,
                   speculative_disable_by_batch_size=self.speculative_disable_by_batch_size,
                   linear_kernel=self.linear_kernel, fused_sampling=self.fused_sampling,
                   dependent_launch=self.dependent_launch, spec_step_graph=self.spec_step_graph,
                   prefill_kernels=self.prefill_kernels)


def _release_memory() -> None:
    """Run after `del`-ing an engine, so the next one gets its GPU memory back."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def apply_mode(engine, mode: str) -> None:
    """Switch the engine to an arm of the ablation, or to a draft loop by name (overlap as configured)."""
    arm = registry.ARMS.get(mode)
    if arm is None:
        engine.set_draft_loop(mode)
    else:
        engine.set_draft_loop(arm.draft_loop, overlap_commit=arm.commit == registry.OVERLAPPED)


def run_mode(llm: LLM, setup: BenchSetup, mode: str, breakdown: bool, progress=None) -> dict:
    try:
        apply_mode(llm.engine, mode)
    except ConfigError as exc:  # e.g. the graph mode on a machine without CUDA
        return {"skipped": str(exc)}
    llm.engine.target.counters.clear()
    llm.engine.spec_step.draft_loop.counters.clear()
    result = time_generate(llm, setup.prompts(llm.engine.vocab_size), setup.params(), setup.num_iters_warmup, setup.num_iters, progress)
    entry = result.summary()
    entry["counters"] = llm.counters
    if breakdown:  # extra iterations with CUDA events, so the headline numbers above carry none
        timer = PhaseTimer(llm.engine.device)
        llm.engine.spec_step.timer = timer
        for _ in range(setup.num_iters):
            llm.generate(setup.prompts(llm.engine.vocab_size), setup.params())
        llm.engine.spec_step.timer = NULL_TIMER
        entry["breakdown_ms_per_call"] = {
            phase: {key: (v / setup.num_iters if isinstance(v, float) else v) for key, v in stats.items()}
            for phase, stats in timer.summary().items()
        }
    return entry


def run_peer(peer: str, setup: BenchSetup, spec_llm: LLM, progress=None, fastest: str | None = None) -> dict:
    on_cuda = spec_llm.engine.device.type == "cuda"
    if peer == "unfused":  # (target_only runs in every round of run_ablation, not here)
        llm, skipped = _unfused_llm(setup, spec_llm, fastest)
        if llm is None:
            return skipped
        entry = _time_unfused(llm, setup, fastest, spec_llm.engine.linear_kernel, progress)
        del llm
        _release_memory()
        return entry
    if peer == "hf_static_loop":
        target = to_hf(spec_llm.engine.target.model)
        fn = HFStaticLoop(target, setup.prompts(spec_llm.engine.vocab_size), setup.output_len, setup.temperature,
                          setup.seed, compile=on_cuda)
        graphs_before = compiled_graph_count()
        entry = time_calls(fn, max(1, setup.num_iters_warmup), setup.num_iters, on_cuda, progress).summary()
        entry["torch_compiled_graphs"] = compiled_graph_count() - graphs_before
        torch._dynamo.reset()
        del target, fn
        _release_memory()
        return entry
    if peer == "hf_assisted" and setup.batch_size != 1:
        return {"skipped": "transformers' assisted generation supports batch size 1 only"}
    target = to_hf(spec_llm.engine.target.model)
    # With the n-gram proposer the assisted peer is transformers' prompt lookup decoding.
    ngram = peer == "hf_assisted" and spec_llm.engine.draft is None
    assistant = to_hf(spec_llm.engine.draft.model) if peer == "hf_assisted" and not ngram else None
    fn = HFGenerate(target, setup.prompts(spec_llm.engine.vocab_size), setup.output_len, setup.temperature, assistant,
                    setup.num_speculative_tokens, setup.seed, prompt_lookup_max=setup.prompt_lookup_max if ngram else None,
                    static_cache=peer == "hf_compiled")
    graphs_before = compiled_graph_count()
    entry = time_calls(fn, max(1, setup.num_iters_warmup), setup.num_iters, on_cuda, progress).summary()
    if peer == "hf_compiled":  # whether torch.compile ran (it does on CUDA, not on a CPU): the label's truth
        entry["torch_compiled_graphs"] = compiled_graph_count() - graphs_before
        torch._dynamo.reset()  # drop the compiled graphs; the peers run last, after every captured mode
    del target, assistant, fn
    _release_memory()
    return entry


def _time_target_only(llm: LLM, setup: BenchSetup, progress) -> dict:
    llm.engine.target.counters.clear()
    entry = time_generate(llm, setup.prompts(llm.engine.vocab_size), setup.params(), setup.num_iters_warmup,
                          setup.num_iters, progress).summary()
    entry["counters"] = llm.counters
    return entry


def _unfused_llm(setup: BenchSetup, spec_llm: LLM, fastest: str | None) -> tuple[LLM | None, dict]:
    """The engine with the fusion off (linear_kernel="cublas": its own engine, the forwards and their CUDA
    graphs being built per linear kernel), or None and why it is skipped."""
    engine = spec_llm.engine
    if not runs_fused_linears(engine) or fastest is None:
        return None, {"skipped": f"nothing to switch off: no model runs fused linears (linear_kernel "
                                 f"{engine.linear_kernel!r}, {engine.dtype})" if fastest else "no mode was timed"}
    return replace(setup, linear_kernel="cublas").llm(), {}


def runs_fused_linears(engine) -> bool:
    runners = [r for r in (engine.target, engine.draft) if r is not None]
    return any(getattr(getattr(r.model, "layer_kernels", None), "fuses", False) for r in runners)


def _time_unfused(llm: LLM, setup: BenchSetup, mode: str, fused_linear_kernel: str, progress) -> dict:
    return run_mode(llm, setup, mode, breakdown=False, progress=progress) | {
        "mode": mode, "fused_linear_kernel": fused_linear_kernel}


def pooled_digest(entries: list[dict]) -> str | None:
    """The rounds' token digest where they agree (None where none was taken), else what each gave: the
    same seeded calls giving other tokens in another round is a finding, not noise."""
    digests = {e.get("token_digest") for e in entries}
    if len(digests) == 1:
        return digests.pop()
    return "differs between rounds: " + ", ".join(sorted(map(str, digests)))


def pool_rounds(rounds: list[dict]) -> dict:
    """Merge R interleaved rounds of the modes: percentiles over all R x iters latencies, and each
    round's p50(main) / p50(mode), whose spread shows how much the host drifted between rounds."""
    pooled = {}
    for mode, first in rounds[0].items():
        if "skipped" in first:
            pooled[mode] = first
            continue
        latencies = [t for r in rounds for t in r[mode]["latencies_s"]]
        entry = dict(first) | LatencyResult(latencies).summary() | {k: first[k] for k in RATE_KEYS}
        digest = pooled_digest([r[mode] for r in rounds])
        if digest is not None:
            entry["token_digest"] = digest
        if BASELINE in rounds[0] and "p50_s" in rounds[0][BASELINE]:
            entry["ratio_to_main_per_round"] = [r[BASELINE]["p50_s"] / r[mode]["p50_s"] for r in rounds]
        pooled[mode] = entry
    return pooled


def run_ablation(setup: BenchSetup, modes=MODES, peers=PEERS, breakdown: bool = False, progress=None, log=print,
                 repeats: int = 1) -> dict:
    """repeats > 1 runs the modes round-robin R times (main, sampler, gpu, graph, main, ...), so a
    drifting host weighs on every mode alike, and pools the rounds (peers run once, but unfused, which
    runs in every round after the modes)."""
    llm = setup.llm()
    rounds = []
    # With several rounds the unfused peer runs in each, after the modes, like one more mode: a slow
    # spell of the machine then weighs on both sides of p50(unfused) / p50(fastest). Its engine is built
    # once, for the mode that was fastest in the first round.
    interleave_unfused = repeats > 1 and "unfused" in peers
    unfused_llm, unfused_mode, unfused_skipped = None, None, None
    # The honest baseline runs in every round too, on an engine of its own built once.
    target_only_llm = setup.llm(speculative=False) if "target_only" in peers else None
    for round_ in range(repeats):
        results = {}
        for mode in modes:
            log(f"  mode {mode} (round {round_ + 1}/{repeats}) ...")
            results[mode] = run_mode(llm, setup, mode, breakdown and round_ == 0, progress)
        if target_only_llm is not None:
            log(f"  peer target_only (round {round_ + 1}/{repeats}) ...")
            results["target_only"] = _time_target_only(target_only_llm, setup, progress)
        if interleave_unfused:
            if round_ == 0:
                unfused_mode = fastest_mode(results)
                unfused_llm, unfused_skipped = _unfused_llm(setup, llm, unfused_mode)
            if unfused_llm is None:
                results["unfused"] = unfused_skipped
            else:
                log(f"  peer unfused, mode {unfused_mode} (round {round_ + 1}/{repeats}) ...")
                results["unfused"] = _time_unfused(unfused_llm, setup, unfused_mode, llm.engine.linear_kernel, progress)
        rounds.append(results)
    del unfused_llm, target_only_llm
    _release_memory()
    results = pool_rounds(rounds) if repeats > 1 else rounds[0]
    fastest = fastest_mode(results)
    if fastest is not None and "p50_s" in results.get("target_only", {}):
        results["target_only"]["ratio_to_fastest_per_round"] = [r["target_only"]["p50_s"] / r[fastest]["p50_s"]
                                                                for r in rounds]
        results["target_only"]["fastest_mode"] = fastest
    if unfused_mode is not None and "p50_s" in results.get("unfused", {}):
        results["unfused"]["ratio_to_mode_per_round"] = [r["unfused"]["p50_s"] / r[unfused_mode]["p50_s"] for r in rounds]
    for peer in sorted(peers, key=PEER_NAMES.index):  # PEER_NAMES' order: hf_compiled last
        if (peer == "unfused" and interleave_unfused) or peer == "target_only":
            continue
        log(f"  peer {peer} ...")
        results[peer] = run_peer(peer, setup, llm, progress, fastest)
    device = llm.engine.device
    config = asdict(setup) | {"resolved_device": str(device), "resolved_dtype": str(llm.engine.dtype),
                              "cuda_graphs": llm.engine.use_cuda_graphs, "kv_blocks": llm.engine.num_blocks,
                              "resolved_layer_kernels": llm.engine.use_layer_kernels,
                              "resolved_linear_kernel": llm.engine.linear_kernel,
                              "kernel_plan": llm.engine.plan.as_record()}
    del llm
    _release_memory()
    return {"config": config | {"repeats": repeats}, "modes": results, "device_type": device.type}


def run_sweep(setup: BenchSetup, batch_sizes=(1, 4, 16, 64), ks=(1, 3, 5, 7), modes=MODES, log=print,
              progress=None, rounds: int = 1) -> dict:
    """p50 per mode over batch sizes and k (peers left out: the sweep is about the draft loop). With
    rounds > 1 the whole grid runs that many times in turn, and each of a point's figures is the median
    of its rounds' (the rounds' p50s kept as p50_rounds_s): a slow spell of the machine then lands in one
    round of every point instead of in all iterations of one point, which is what moved ratios between
    batch sizes from run to run."""
    rounds_of: dict[tuple, list[dict]] = {}
    grid = [(r, k, batch) for r in range(rounds) for k in ks for batch in batch_sizes]
    for r, k, batch in (progress or (lambda it: it))(grid):
        # one engine per (k, batch): its KV pool and graphs are sized for them
        point_setup = replace(setup, batch_size=batch, num_speculative_tokens=k)
        llm = point_setup.llm()
        log(f"  sweep k={k} batch={batch}" + (f" round {r + 1}/{rounds}" if rounds > 1 else ""))
        plan = llm.engine.plan.as_record()
        for mode in modes:
            entry = run_mode(llm, point_setup, mode, breakdown=False) | {"kernel_plan": plan}
            if "skipped" not in entry:
                rounds_of.setdefault((k, batch, mode), []).append(entry)
        del llm
        _release_memory()
    points = []
    for (k, batch, mode), entries in rounds_of.items():
        point = {"k": k, "batch_size": batch, "mode": mode}
        for key in ("p50_s", "p10_s", "p90_s", "acceptance_rate"):
            point[key] = float(np.median([e[key] for e in entries]))
        # tokens a spec step made (None without a spec step): what compares points of different k
        lengths = [e["mean_accepted_len"] for e in entries]
        point["mean_accepted_len"] = None if None in lengths else float(np.median(lengths))
        if rounds > 1:
            point["p50_rounds_s"] = [e["p50_s"] for e in entries]
        digest = pooled_digest(entries)  # over every timed call's ids: two trees' points with one made the same tokens
        if digest is not None:
            point["token_digest"] = digest
        point["kernel_plan"] = entries[0]["kernel_plan"]
        points.append(point)
    return {"batch_sizes": list(batch_sizes), "ks": list(ks), "rounds": rounds, "points": points}
