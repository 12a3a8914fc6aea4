"""The bench's command line: its flags (vLLM's benchmark_latency names where they exist), the
machine's defaults for a bare command, and the checks made before anything runs."""
from __future__ import annotations

import argparse
import textwrap

import torch

from protospec.bench.ablation import MODES, PEERS, BenchSetup
from protospec.bench.compare import TRAINED_PAIR
from protospec.bench.engine_flags import add_engine_flags, engine_switches
from protospec import registry
from protospec.command_line import CommandParser

RUNS_DIR = "runs"             # ignored by git: where runs go unless recorded on purpose
RECORD_DIR = "data/results"   # the runs of record (--record)

# With no arguments: the seed study's configuration on a GPU; on a CPU, a small one (~10 s on 2 cores).
GPU_DEFAULTS = dict(model="JackFram/llama-160m", speculative_model="JackFram/llama-68m", num_speculative_tokens=5,
                    input_len=256, output_len=128, batch_size=1, num_iters_warmup=5, num_iters=10, load_format="dummy")
CPU_DEFAULTS = dict(GPU_DEFAULTS, input_len=32, output_len=32, num_iters_warmup=1, num_iters=3)


VLLM_ACCEPTANCE = {"rejection_sampler": registry.REJECTION, "typical_acceptance_sampler": registry.TYPICAL}


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default in its help; lines as wide as the
    docstring's, not the terminal's 80 columns (which doubled the help's length)."""

    def __init__(self, prog):
        super().__init__(prog, max_help_position=38, width=118)

    def _get_help_string(self, action):
        if action.default in (None, False) or "default" in (action.help or ""):
            return action.help  # nothing to say, or said already
        return super()._get_help_string(action)


# vLLM benchmark_latency.py flags that do not apply to a single-GPU, Llama-only prototype: accepted so
# vLLM's commands run as written, ignored with a warning when set to anything but vLLM's default.
IGNORED_VLLM_FLAGS = {
    "--tokenizer": (None, "prompts are random token ids: no tokenizer is used"),
    "--quantization": (None, "no quantized weights here"),
    "--tensor-parallel-size": (1, "one device only"),
    "--speculative-draft-tensor-parallel-size": (None, "one device only"),
    "--kv-cache-dtype": ("auto", "the KV cache takes the model's dtype"),
    "--quantization-param-path": (None, "no quantized KV cache here"),
    "--trust-remote-code": (False, "only Llama configs are loaded, by protospec's own code"),
    "--enable-chunked-prefill": (False, "prefill runs whole"),
    "--enable-prefix-caching": (False, "no prefix cache here"),
    "--ray-workers-use-nsight": (False, "no Ray workers here"),
    "--download-dir": (None, "checkpoints load from the Hugging Face cache or a local directory"),
    "--gpu-memory-utilization": (0.9, "the KV pool is sized for the benchmark's batch, not for a memory share"),
    "--distributed-executor-backend": (None, "one process"),
    "--otlp-traces-endpoint": (None, "no tracing"),
}


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    ignored = textwrap.fill("vLLM's flags accepted and ignored here (a warning names each one set): "
                            + ", ".join(IGNORED_VLLM_FLAGS) + ".", width=110,
                            break_on_hyphens=False)
    p = CommandParser(
        prog="python -m protospec.bench", usage="python -m protospec.bench [options]", description=description,
        formatter_class=_HelpFormatter, allow_abbrev=False, epilog=ignored)
    parser = p
    p = p.add_argument_group("vLLM's benchmark_latency flags", "Unset, the run's shape is this machine's default: the seed "
                             "configuration on a GPU, a small one on a CPU.")
    p.add_argument("--model", default=None, help="target checkpoint: hub id or local directory")
    p.add_argument("--speculative-model", default=None, help="draft checkpoint")
    p.add_argument("--num-speculative-tokens", type=int, default=None, help="k, tokens proposed per spec step")
    p.add_argument("--input-len", type=int, default=None, help="prompt tokens per request")
    p.add_argument("--output-len", type=int, default=None, help="generated tokens per request")
    p.add_argument("--batch-size", type=int, default=None, help="requests per generate() call")
    p.add_argument("--n", type=int, default=1, help="samples per prompt (only 1 is implemented)")
    p.add_argument("--use-beam-search", action="store_true", help="refused: no beam search here")
    p.add_argument("--num-iters-warmup", type=int, default=None, help="untimed calls per mode")
    p.add_argument("--num-iters", type=int, default=None, help="timed calls per mode")
    p.add_argument("--dtype", default="auto", choices=["auto", "half", "float16", "bfloat16", "float", "float32", "float64"],
                   help="weights and activations (auto: float16 on CUDA, float32 on a CPU)")
    p.add_argument("--max-model-len", type=int, default=None, help="longest sequence (default: the target's "
                   "max_position_embeddings)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    p.add_argument("--load-format", default=None, choices=["auto", "dummy"],
                   help="dummy = random weights from the checkpoint's config (offline) (unset: dummy for the "
                        "bare command, else auto)")
    p.add_argument("--seed", type=int, default=0, help="prompts and sampling")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (the original script sampled at 1.0)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs (forwards run eagerly)")
    p.add_argument("--output-json", default=None,
                   help="write this run's numbers here (vLLM's keys and protospec's)")
    p.add_argument("--profile", action="store_true", help="write a torch profiler trace of one timed call")
    p.add_argument("--profile-result-dir", default=None, help="where --profile writes (default: runs/profile)")
    p.add_argument("--use-v2-block-manager", action="store_true", help="accepted for compatibility; a no-op here")
    p.add_argument("--speculative-disable-by-batch-size", type=int, default=None,
                   help="target-only steps while more requests than this run")
    p = parser.add_argument_group("the study: draft loops, proposers, acceptance")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 on a CPU, where more made timings swing)")
    p.add_argument("--draft-loop", default=registry.AUTO, choices=[registry.AUTO, *MODES], metavar="MODE",
                   help=f"{' | '.join([registry.AUTO, *MODES])}: where the draft's inputs are built and when the "
                        f"host syncs (registry.py says each; {registry.AUTO}: {registry.AUTO_DOC})")
    p.add_argument("--proposer", default=None, choices=list(registry.PROPOSER_DOC),
                   help="; ".join(f"{name}: {doc}" for name, doc in registry.PROPOSER_DOC.items())
                        + f" (ngram = --speculative-model '{registry.NGRAM_MODEL}'; unset: as --speculative-model says)")
    p.add_argument("--prompt-lookup-max", "--ngram-prompt-lookup-max", type=int, default=4,
                   help="the n-gram proposer's longest suffix to look up")
    p.add_argument("--prompt-lookup-min", "--ngram-prompt-lookup-min", type=int, default=1,
                   help="the n-gram proposer's shortest suffix to look up")
    p.add_argument("--acceptance", default=registry.REJECTION, choices=list(registry.ACCEPTANCE_DOC),
                   help="; ".join(f"{name}: {doc}" for name, doc in registry.ACCEPTANCE_DOC.items()))
    p.add_argument("--spec-decoding-acceptance-method", default=None, choices=list(VLLM_ACCEPTANCE),
                   help="vLLM's name for --acceptance")
    p.add_argument("--posterior-threshold", "--typical-acceptance-sampler-posterior-threshold", type=float,
                   default=0.09, help="typical acceptance: the bar's upper limit")
    p.add_argument("--posterior-alpha", "--typical-acceptance-sampler-posterior-alpha", type=float, default=0.3,
                   help="typical acceptance: the bar is min(threshold, alpha * exp(-entropy))")
    p = parser.add_argument_group("kernels and graphs")
    add_engine_flags(p)
    for flag, (default, _) in IGNORED_VLLM_FLAGS.items():  # named in the epilog
        kind = {"action": "store_true"} if default is False else {"default": default, "type": type(default) if default is not None else str}
        parser.add_argument(flag, **kind, help=argparse.SUPPRESS)
    g = parser.add_argument_group("ablation and sweep reports")
    g.add_argument("--ablation", action="store_true", help="run every mode and peer; write JSON, markdown, PNG")
    g.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES), metavar="MODE",
                   help=f"draft-loop modes to time (default: all: {' '.join(MODES)})")
    g.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(PEERS), metavar="PEER",
                   help=f"baselines to time beside them (default: all: {' '.join(PEERS)})")
    g.add_argument("--repeats", type=int, default=3,
                   help="rounds of the modes, round-robin and pooled (target_only and unfused run in each; a "
                        "drifting host weighs on all alike)")
    g.add_argument("--draft-equals-target", action="store_true", help="use the target as its own draft (acceptance 1.0)")
    g.add_argument("--breakdown", action="store_true", help="per-phase CPU/GPU time (extra iterations with CUDA events)")
    g.add_argument("--sweep", action="store_true", help="p50 per mode over --sweep-batch-sizes x --sweep-ks")
    g.add_argument("--sweep-batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64], help="the sweep's batch sizes")
    g.add_argument("--sweep-ks", type=int, nargs="+", default=[1, 3, 5, 7], help="the sweep's k values")
    g.add_argument("--sweep-rounds", type=int, default=1,
                   help="run the sweep's grid this many times in turn; each point's figures are the medians of its rounds'")
    c = parser.add_argument_group("compare report (proposers x acceptance rules)")
    c.add_argument("--compare", action="store_true",
                   help="every combination below on one pair over a fixed prompt set, greedy and T=1 "
                        f"(default pair: the trained pair in {TRAINED_PAIR}, its held-out prompts)")
    c.add_argument("--compare-proposers", nargs="+", default=list(registry.PROPOSER_DOC), choices=list(registry.PROPOSER_DOC),
                   metavar="PROPOSER", help=f"proposers to compare (default: all: {' '.join(registry.PROPOSER_DOC)})")
    c.add_argument("--compare-acceptance", nargs="+", default=list(registry.ACCEPTANCE_DOC),
                   choices=list(registry.ACCEPTANCE_DOC), metavar="RULE",
                   help=f"acceptance rules to compare (default: all: {' '.join(registry.ACCEPTANCE_DOC)})")
    c.add_argument("--compare-prompts", type=int, default=32, help="prompts from --compare-prompts-json")
    c.add_argument("--compare-prompts-json", default=f"{TRAINED_PAIR}/heldout_prompts.json",
                   help="a JSON with a 'prompts' list of token-id lists")
    c.add_argument("--compare-max-tokens", type=int, default=64, help="new tokens per prompt")
    c.add_argument("--compare-repeats", type=int, default=3, help="passes over the prompts; a prompt's latency is its median")
    g = parser.add_argument_group("where reports go")
    g.add_argument("--output-dir", default=None,
                   help="where --ablation / --sweep write (default: runs/, names carry date, commit and time; "
                        "with --record: data/results/)")
    g.add_argument("--record", action="store_true",
                   help="a run of record: write into data/results/ under date_device_tag_commit, never over an "
                        "existing file")
    g.add_argument("--force", action="store_true", help="let --record replace existing files")
    return parser


def check_args(args: argparse.Namespace, warn=print) -> None:
    """Refuse what cannot be honoured; warn about vLLM flags that do not apply."""
    if args.n != 1:
        raise SystemExit(f"--n {args.n}: only one sample per prompt is implemented")
    if args.use_beam_search:
        raise SystemExit("--use-beam-search: beam search is not implemented")
    for name in ("num_iters", "num_iters_warmup", "batch_size", "input_len", "output_len", "repeats", "compare_repeats",
                 "sweep_rounds"):
        value = getattr(args, name)
        least = 0 if name == "num_iters_warmup" else 1
        if value is not None and value < least:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= {least}, got {value}")
    for flag, (default, why) in IGNORED_VLLM_FLAGS.items():
        if getattr(args, flag[2:].replace("-", "_")) != default:
            warn(f"warning: {flag} is ignored: {why}")
    kind = registry.DRAFT_LOOPS.get(draft_loop_of(args.draft_loop))
    if args.enforce_eager and kind is not None and kind.needs_cuda_graphs:
        raise SystemExit(f"--draft-loop {args.draft_loop} replays CUDA graphs: it cannot run with --enforce-eager")


def draft_loop_of(mode: str) -> str:
    """The engine's draft loop for a --draft-loop choice (an arm of the ablation, or auto)."""
    arm = registry.ARMS.get(mode)
    return arm.draft_loop if arm is not None else mode


def resolve_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill unset flags from this machine's defaults; a bare command runs the whole default."""
    on_gpu = torch.cuda.is_available() if args.device is None else args.device.startswith("cuda")
    defaults = GPU_DEFAULTS if on_gpu else CPU_DEFAULTS
    bare = args.model is None
    for key, value in defaults.items():
        # A named checkpoint loads its weights: dummy weights are the bare command's default only.
        if getattr(args, key) is None and (bare or key not in ("speculative_model", "model", "load_format")):
            setattr(args, key, value)
    if args.load_format is None:
        args.load_format = "auto"
    if args.draft_equals_target:
        args.speculative_model = args.model
    if args.proposer == registry.NGRAM:
        args.speculative_model = registry.NGRAM_MODEL
    if args.spec_decoding_acceptance_method is not None:
        args.acceptance = VLLM_ACCEPTANCE[args.spec_decoding_acceptance_method]
    args.dtype = {"half": "float16", "float": "float32"}.get(args.dtype, args.dtype)  # vLLM's aliases
    if args.threads is None and not on_gpu:
        args.threads = 1
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.threads = torch.get_num_threads()
    if args.output_dir is None:
        args.output_dir = RECORD_DIR if args.record else RUNS_DIR
    return args


def setup_from(args) -> BenchSetup:
    return BenchSetup(args.model, args.speculative_model, args.num_speculative_tokens, args.input_len, args.output_len,
                      args.batch_size, args.num_iters_warmup, args.num_iters, args.dtype, args.block_size,
                      args.load_format, args.seed, args.temperature, args.device, enforce_eager=args.enforce_eager,
                      max_model_len=args.max_model_len, acceptance=args.acceptance,
                      posterior_threshold=args.posterior_threshold, posterior_alpha=args.posterior_alpha,
                      prompt_lookup_min=args.prompt_lookup_min, prompt_lookup_max=args.prompt_lookup_max,
                      speculative_disable_by_batch_size=args.speculative_disable_by_batch_size, **engine_switches(args))
