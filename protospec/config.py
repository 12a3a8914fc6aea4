"""Engine and sampling settings, validated where they are made."""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass

import numpy as np
import torch

from protospec.device_wait import DEFAULT_TIMEOUT_S
from protospec.errors import ConfigError, SamplingParamsError
from protospec.layout import LINEAR_KERNELS
from protospec import registry

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


DEVICE_TYPES = ("cpu", "cuda")


def check_device(device) -> None:
    """None / "auto", or a CPU or CUDA device (a string or torch.device); anything else is named."""
    if device in (None, "auto"):
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if dev.type not in DEVICE_TYPES:
        raise ConfigError(f"device {device!r}: the engine runs on {' or '.join(DEVICE_TYPES)} devices "
                          f"(its KV cache and weights need real memory), not {dev.type}")


def resolve_device(device: str | None) -> torch.device:
    check_device(device)
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} asked for, but torch sees no CUDA device")
    return dev


def device_memory_bytes(device: torch.device) -> int:
    """All the memory of the device (a GPU's, or the host's physical memory for a CPU)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): no bound we can trust
        return 1 << 62


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":  # fp16 where kernels are fast, fp32 on the CPU where fp16 matmuls crawl
        return torch.float16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def _is_int(value) -> bool:
    """A true integer (Python or numpy), not a bool and not a float that happens to be whole."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


SEED_RANGE = (0, 2**63 - 1)


MAX_SPECULATIVE_TOKENS = 64   # k + 1 verify positions per sequence; far past where acceptance pays
MAX_NUM_SEQS = 4096


@dataclass
class EngineConfig:
    model: str
    speculative_model: str | None = None
    num_speculative_tokens: int = 5
    load_format: str = "auto"
    dtype: str = "auto"
    device: str | None = None
    block_size: int = 16
    num_kv_blocks: int | None = None     # None: sized from kv_cache_gib
    kv_cache_gib: float | None = None    # None: 2 GiB on CUDA, 0.25 GiB on CPU
    max_num_seqs: int = 64
    max_model_len: int | None = None     # None: the target's max_position_embeddings
    seed: int = 0
    draft_loop: str = registry.AUTO      # the draft loop's way: one of registry.DRAFT_LOOP_NAMES
    check_no_sync: bool = False          # trip on any host sync inside the draft loop (debugging)
    cuda_graphs: bool | None = None      # replay fixed-shape forwards as CUDA graphs; None = on CUDA
    # The rejection sampler as one Numba kernel (kernels/sampling/rejection.py) instead of ~25 torch ops;
    # None = on CUDA. Same tokens either way (a test checks); on a CPU the torch ops are faster
    # than the simulator.
    fused_rejection: bool | None = None
    # Decode-shaped forwards (draft steps, verify, target decode) on the Numba layer kernels: 5-9
    # kernels per layer instead of ~20 (layer_kernels.py). None = on CUDA for float16/float32.
    layer_kernels: bool | None = None
    # Softmax + exponential-race sample of each draft step (and the verify's softmax) as two Numba
    # kernels over vocabulary slices writing into the spec step's buffers (kernels/sampling/softmax_sample.py) instead
    # of torch's ops. None: on a CUDA device with the layer kernels (measured faster there, with the
    # step graph: data/results/README.md); False: torch's ops; True: the kernels (the simulator's on a CPU).
    fused_sampling: bool | None = None
    # The layer kernels' linear layers: "cublas" (torch's) or "mma_fused", the tensor-core GEMV with the
    # norms, residual adds, RoPE with the cache store, SiLU x up, the embedding and the final norm folded
    # in, where it applies (layout.LINEAR_KERNELS). None: "mma_fused" with the layer kernels (the fastest,
    # measured: data/results/README.md), "cublas" without. "cublas" is the fusion's off switch.
    linear_kernel: str | None = None
    # The tensor-core GEMVs launched as programmatic dependents (sm_90 and later): each starts while
    # the kernel before it ends and loads its weights before it waits for that kernel's output
    # (kernels/launch/dependent_launch.py). None: on wherever the tensor-core linears run on sm_90 or later
    # (measured faster: data/results/README.md); False: ordinary launches; True: on, or an error.
    dependent_launch: bool | None = None
    # The commit policy of the device draft loops (speculation/commit.py): True = overlapped (the next
    # spec step's draft step 1 is built on the device and queued before the commit's host sync, so
    # the device works while the host commits), False = synced. The CPU-prepared loops are synced.
    overlap_commit: bool = True
    # A spec step the overlapped commit launched runs whole as one CUDA graph (speculation/step_graph.py):
    # draft steps 1..k, the verify's inputs built on the device, the verify, the rejection sampler and
    # the commit's row. Applies to the graph draft loop with a draft model, fixed k and the
    # overlapped commit. None (default): on wherever it applies (one launch a step leaves the host
    # idle, so host noise stops reaching the step; measured faster: data/results/README.md); False:
    # stage by stage; True: on, and an error where it cannot apply.
    spec_step_graph: bool | None = None
    # A prefill at batch 1 (a uniform chunk longer than the decode shapes) on the layer kernels' 9-kernel
    # path with cuBLAS linears rather than the torch path. None: on a GPU (measured faster there:
    # data/results/README.md); in the CPU simulator every prompt token through simulated kernels takes minutes.
    prefill_kernels: bool | None = None
    # Which draft tokens a spec step keeps (speculation/acceptance.py): "rejection" (lossless) or "typical"
    # (Medusa's typical acceptance, lossy; posterior_threshold and posterior_alpha as vLLM names them).
    acceptance: str = registry.REJECTION
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    # The n-gram proposer (speculative_model="[ngram]"): the longest suffix of prompt_lookup_max ..
    # prompt_lookup_min tokens that occurred before is looked up (kernels/inputs/ngram_match.py).
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    # Target-only steps while more requests than this run (vLLM's name); None = always speculate. Where
    # speculation stops paying depends on the pair, the acceptance and the GPU: `python -m
    # protospec.bench.throughput` finds a pair's crossover batch (data/results/README.md has the runs).
    speculative_disable_by_batch_size: int | None = None
    # The longest the host waits for the device at any one point (a prefill's tokens, a step's commit)
    # before it raises DeviceWaitError instead of hanging (device_wait.py).
    device_wait_timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        """Checked before anything is loaded or allocated; the upper bounds keep a typo from asking
        for tens of GB (the KV pool's size is checked against the device once the models are known)."""
        if not isinstance(self.model, (str, os.PathLike)) or not str(self.model):
            raise ConfigError(f"model must be a Hugging Face hub id or a checkpoint directory (a non-empty str or "
                              f"path), got {self.model!r}")
        if self.speculative_model is not None and (not isinstance(self.speculative_model, (str, os.PathLike))
                                                   or not str(self.speculative_model)):
            raise ConfigError(f"speculative_model must be None, '[ngram]', a hub id or a checkpoint directory, got "
                              f"{self.speculative_model!r}")
        self.model = str(self.model)
        if self.speculative_model is not None:
            self.speculative_model = str(self.speculative_model)
        check_device(self.device)
        k = self.num_speculative_tokens
        if self.speculative_model is not None and (not _is_int(k) or not 1 <= k <= MAX_SPECULATIVE_TOKENS):
            raise ConfigError(f"num_speculative_tokens (k) must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
        if not _is_int(self.block_size) or not 1 <= self.block_size <= 1024 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a power of two in [1, 1024], got {self.block_size!r}")
        if not _is_int(self.max_num_seqs) or not 1 <= self.max_num_seqs <= MAX_NUM_SEQS:
            raise ConfigError(f"max_num_seqs must be an integer in [1, {MAX_NUM_SEQS}], got {self.max_num_seqs!r}")
        if self.max_model_len is not None and (not _is_int(self.max_model_len) or self.max_model_len < 2):
            raise ConfigError(f"max_model_len must be None or an integer >= 2, got {self.max_model_len!r}")
        if self.num_kv_blocks is not None and not _is_int(self.num_kv_blocks):
            raise ConfigError(f"num_kv_blocks must be None or an integer, got {self.num_kv_blocks!r}")
        gib = self.kv_cache_gib
        if gib is not None and (not _is_real(gib) or not math.isfinite(gib) or gib <= 0):
            raise ConfigError(f"kv_cache_gib must be None or a finite number > 0, got {gib!r}")
        if not _is_int(self.seed) or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise ConfigError(f"seed must be an integer in [0, 2**63 - 1], got {self.seed!r}")
        if self.draft_loop not in registry.DRAFT_LOOP_NAMES:
            raise ConfigError(f"draft_loop must be one of {registry.DRAFT_LOOP_NAMES}, got {self.draft_loop!r}")
        kind = registry.DRAFT_LOOPS.get(self.draft_loop)
        if self.check_no_sync and kind is not None and kind.host_sync_per_step:
            raise ConfigError(f"check_no_sync cannot hold with draft_loop={self.draft_loop!r}, which syncs every draft step")
        if not isinstance(self.overlap_commit, (bool, np.bool_)):  # a switch, not a truthy string
            raise ConfigError(f"overlap_commit must be True or False, got {self.overlap_commit!r}")
        if self.prefill_kernels is not None and not isinstance(self.prefill_kernels, (bool, np.bool_)):
            raise ConfigError(f"prefill_kernels must be None, True or False, got {self.prefill_kernels!r}")
        if self.linear_kernel is not None and self.linear_kernel not in LINEAR_KERNELS:
            raise ConfigError(f"linear_kernel must be None or one of {LINEAR_KERNELS}, got {self.linear_kernel!r}")
        if self.acceptance not in registry.ACCEPTANCE_DOC:
            raise ConfigError(f"acceptance must be one of {tuple(registry.ACCEPTANCE_DOC)}, got {self.acceptance!r}")
        for name in ("posterior_threshold", "posterior_alpha"):
            value = getattr(self, name)
            if not _is_real(value) or not math.isfinite(value) or not 0 < value <= 1:
                raise ConfigError(f"{name} must be a number in (0, 1], got {value!r}")
        cap = self.speculative_disable_by_batch_size
        if cap is not None and (not _is_int(cap) or cap < 1):
            raise ConfigError(f"speculative_disable_by_batch_size must be None or an integer >= 1, got {cap!r}")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not _is_int(lo) or not _is_int(hi) or not 1 <= lo <= hi <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"prompt_lookup_min / prompt_lookup_max must be integers with 1 <= min <= max <= "
                              f"{MAX_SPECULATIVE_TOKENS}, got {lo!r} / {hi!r}")
        wait = self.device_wait_timeout_s
        if not _is_real(wait) or not math.isfinite(wait) or wait <= 0:
            raise ConfigError(f"device_wait_timeout_s must be a finite number of seconds > 0, got {wait!r}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ConfigError(f"num_kv_blocks must be >= 2 (block 0 is reserved), got {self.num_kv_blocks}")

    @property
    def proposer(self) -> str | None:
        """registry.NGRAM for speculative_model="[ngram]", registry.DRAFT for a draft model, None without."""
        if not self.speculative_model:
            return None
        return registry.NGRAM if self.speculative_model == registry.NGRAM_MODEL else registry.DRAFT

    @property
    def k(self) -> int:
        """Draft tokens per spec step; 0 means target-only decoding."""
        return self.num_speculative_tokens if self.speculative_model else 0


# Temperatures below this sample greedily, as vLLM's (its _SAMPLING_EPS): logits / T would overflow
# float32 to inf (T <= ~1e-38 turned every probability into nan and every token into 0).
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 (or below GREEDY_BELOW) = greedy. top_k 0 = off, top_p 1.0 = off. seed: per
    request, None = engine rng. Frozen: checked once here, a value cannot change behind the checks'
    back (dataclasses.replace makes a checked copy). numpy numbers are kept as Python's."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_tokens: int = 16
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        t, top_p = self.temperature, self.top_p
        if not _is_real(t) or not math.isfinite(t) or t < 0:
            raise SamplingParamsError(f"temperature must be a finite number >= 0 (0 = greedy), got {t!r}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise SamplingParamsError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not _is_real(top_p) or not math.isfinite(top_p) or not 0.0 < top_p <= 1.0:
            raise SamplingParamsError(f"top_p must be a number in (0, 1] (1 = off), got {top_p!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise SamplingParamsError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.ignore_eos, (bool, np.bool_)):
            raise SamplingParamsError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if self.seed is not None and (not _is_int(self.seed) or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]):
            raise SamplingParamsError(f"seed must be None or an integer in [0, 2**63 - 1], got {self.seed!r}")
        # Python numbers from here on: torch.Generator.manual_seed refuses a numpy integer, for one.
        for name, kind in (("temperature", float), ("top_k", int), ("top_p", float), ("max_tokens", int),
                           ("ignore_eos", bool)):
            object.__setattr__(self, name, kind(getattr(self, name)))
        if self.seed is not None:
            object.__setattr__(self, "seed", int(self.seed))

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW
