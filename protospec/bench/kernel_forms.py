"""The switches the bench and the kernel census share: kernel forms chosen process-wide before any
engine captures a graph (each at the form timed faster), and the engine's on/off
settings for repeated prefills and draft step 1, as flags and applied from parsed arguments."""
from __future__ import annotations

import argparse

from protospec.kernels import attention_mma, dependent_launch, gemv_mma, sampling
from protospec.model import layer_kernels

ON_OFF_CHOICES = ["on", "off"]


def add_kernel_form_args(p: argparse.ArgumentParser, shown: bool = True) -> None:
    """The kernel-form switches of the timed experiments; shown=False keeps them out of --help (the
    bench lists them under --help-kernel-forms)."""
    _add_switches(p, shown)


def kernel_forms_help() -> str:
    """The switches' own help text (python -m protospec.bench --help-kernel-forms)."""
    p = argparse.ArgumentParser(prog="python -m protospec.bench", usage="python -m protospec.bench [options]",
                                description="Kernel-form switches of the timed experiments (each names its default).",
                                add_help=False)
    _add_switches(p, shown=True)
    return p.format_help()


def _add_switches(p: argparse.ArgumentParser, shown: bool) -> None:
    def add(*flags, **kwargs):
        p.add_argument(*flags, **(kwargs if shown else {**kwargs, "help": argparse.SUPPRESS}))

    add("--step-kernels-dependent", default="on", choices=ON_OFF_CHOICES,
        help="the draft step's sampling kernels and advance_step launched as programmatic dependents "
             "where the forward before them is (sm_90; default: %(default)s)")
    add("--prefetch-norm", default="on", choices=ON_OFF_CHOICES,
        help="the tensor-core GEMVs' normed forms load the norm weight before waiting for their "
             "input (same bits; default: %(default)s)")
    add("--attention-early-loads", default="on", choices=ON_OFF_CHOICES,
        help="the tensor-core attention, launched as a dependent, loads the positions, table entries "
             "and a first tile of older keys before its wait (same bits; default: %(default)s)")
    add("--lm-head-max-registers", type=int, default=0, choices=[0, 128, 96, 80],
        help="registers a thread of the tensor-core LM head, so more of its blocks fit an SM at once "
             "(0: the compiler's choice; same bits; default: %(default)s)")
    add("--lm-head-prefetch-norm", default="on", choices=ON_OFF_CHOICES,
        help="the tensor-core LM head loads the norm weight before waiting for its input, as "
             "--prefetch-norm (which turns it off too; same bits; default: %(default)s)")
    add("--logit-stats", default="off", choices=ON_OFF_CHOICES,
        help="the tensor-core LM head also writes each 16-row vocabulary tile's softmax statistics, and the "
             "sampling kernels combine them instead of a statistics kernel reading the logits (rows at "
             "T = 1 or greedy; default: %(default)s)")
    add("--head-norm", default="folded", choices=["fused", "separate", "tail", "squares", "folded"],
        help="the fused forward's final norm in the LM head GEMV's loads, a one-block kernel of its "
             "own before the plain GEMV, run by the last block of the last down projection, or taken by "
             "the LM head from the sums of squares the last down projection writes (same bits), or "
             "'folded': those sums scale the plain LM head's rows, its weight times the norm's "
             "(float16 rounding; default: %(default)s)")
    for linear in ("o", "down"):
        add(f"--{linear}-k-splits", type=int, default=1, choices=[1, 2, 4],
            help=f"the tensor-core {linear} projection's K over this many blocks a 16-row tile, the last "
                 "to finish summing them (same bits; default: %(default)s)")
    add("--gemv-early-allow", default="o,gate_up,down",
        help="comma-separated linears (o, gate_up, down) that let the next kernel launch before their own "
             "wait, so its weights stream during the whole wait (none: all after; default: %(default)s)")
    add("--pin-weight-loads", default="on", choices=ON_OFF_CHOICES,
        help="the tensor-core GEMVs' dependent forms keep their wait below the weight loads in the machine "
             "code, so the weights stream while the kernel before ends (same bits; default: %(default)s)")
    add("--wide-weight-loads", default="on", choices=ON_OFF_CHOICES,
        help="the tensor-core GEMVs load their weight words two at a time (16-byte loads, half the load "
             "instructions; same bits; default: %(default)s)")
    add("--rope-inputs-early", default="on", choices=ON_OFF_CHOICES,
        help="the tensor-core qkv projection loads its RoPE inputs (positions, slots, cos / sin rows) "
             "before its wait in every layer but the first, not after it (same bits; default: "
             "%(default)s)")
    add("--attention-tiles-per-split", type=int, default=8, choices=[1, 2, 4, 8],
        help="the tensor-core attention's split-K: a split per this many steps of a block's key tiles "
             "over the widest context the block table allows, while the grid leaves SMs idle (same "
             "tokens; default: %(default)s)")
    add("--attention-pipeline", default="on", choices=ON_OFF_CHOICES,
        help="the tensor-core attention loads a warp's next key tile before the products of this one "
             "(same bits; default: %(default)s)")
    add("--attention-early-tiles", type=int, default=1, choices=[1, 2, 3],
        help="the tensor-core attention, with its early loads and pipeline, loads this many of a warp's "
             "tiles of older keys before its wait (same bits; default: %(default)s)")
    add("--probs-prefetch", default="on", choices=ON_OFF_CHOICES,
        help="the probabilities kernel, as a dependent, loads its logits and noise before its wait "
             "(same bits; default: %(default)s)")
    add("--stats-combine", default="every_block", choices=["last_block", "every_block"],
        help="a row's slice statistics combined by the statistics kernel's last block of the row, or by "
             "every block of the probabilities kernel itself (same bits; default: %(default)s)")
    add("--advance-in-sampler", default="on", choices=ON_OFF_CHOICES,
        help="the draft step's probabilities kernel writes the next step's inputs (token, position, length, "
             "slot) itself instead of an advance_step launch after it (the fused sampling kernels in two "
             "launches; same tokens; default: %(default)s)")
    add("--prefill-kernels", default="auto", choices=["auto", *ON_OFF_CHOICES],
        help="a prefill at batch 1 (a uniform chunk longer than the decode shapes) on the layer kernels' "
             "9-kernel path with cuBLAS linears, not the torch path (auto: on a GPU, off in the CUDA "
             "simulator; default: %(default)s)")
    add("--prefill-graphs", default="on", choices=ON_OFF_CHOICES,
        help="replay a uniform prefill layout seen before as a CUDA graph (default: %(default)s)")
    add("--first-step-at-begin", default="on", choices=ON_OFF_CHOICES,
        help="where no spec step was launched ahead (the batch changed, or a request nears its end), "
             "build draft step 1 on the device at the step's start (off: on the CPU; default: %(default)s)")


def apply_kernel_forms(args: argparse.Namespace) -> None:
    """Set the process-wide kernel forms the flags chose (before any engine captures a graph)."""
    dependent_launch.STEP_KERNELS = args.step_kernels_dependent == "on"
    gemv_mma.PREFETCH_NORM = args.prefetch_norm == "on"
    attention_mma.EARLY_LOADS = args.attention_early_loads == "on"
    attention_mma.PIPELINE = args.attention_pipeline == "on"
    attention_mma.TILES_PER_SPLIT = args.attention_tiles_per_split
    attention_mma.EARLY_TILES = args.attention_early_tiles
    sampling.PROBS_PREFETCH = args.probs_prefetch == "on"
    sampling.ADVANCE_IN_SAMPLER = args.advance_in_sampler == "on"
    sampling.STATS_COMBINE = args.stats_combine
    gemv_mma.LM_HEAD_MAX_REGISTERS = args.lm_head_max_registers
    gemv_mma.LM_HEAD_PREFETCH_NORM = args.lm_head_prefetch_norm == "on"
    gemv_mma.LOGIT_STATS = args.logit_stats == "on"
    layer_kernels.HEAD_NORM = args.head_norm
    gemv_mma.O_K_SPLITS, gemv_mma.DOWN_K_SPLITS = args.o_k_splits, args.down_k_splits
    gemv_mma.EARLY_ALLOW = early_allow_set(args.gemv_early_allow)
    gemv_mma.PIN_WEIGHT_LOADS = args.pin_weight_loads == "on"
    gemv_mma.WIDE_WEIGHT_LOADS = args.wide_weight_loads == "on"
    gemv_mma.ROPE_INPUTS_BEFORE_WAIT = args.rope_inputs_early == "on"
    if args.prefill_kernels != "auto":
        layer_kernels.LONG_CHUNKS = args.prefill_kernels == "on"


EARLY_ALLOW_LINEARS = ("o", "gate_up", "down")


def early_allow_set(text: str) -> frozenset:
    """--gemv-early-allow's value ("none" or comma-separated linears) as gemv_mma.EARLY_ALLOW."""
    chosen = frozenset() if text == "none" else frozenset(part.strip() for part in text.split(","))
    unknown = sorted(chosen - set(EARLY_ALLOW_LINEARS))
    if unknown:
        raise SystemExit(f"--gemv-early-allow: {', '.join(unknown)} not among {', '.join(EARLY_ALLOW_LINEARS)} (or none)")
    return chosen


def engine_switches(args: argparse.Namespace) -> dict:
    """The engine's on/off settings the flags chose, as BenchSetup (and EngineConfig) take them."""
    return dict(first_step_at_begin=args.first_step_at_begin == "on", prefill_graphs=args.prefill_graphs == "on")
