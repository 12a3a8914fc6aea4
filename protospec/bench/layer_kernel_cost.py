"""GPU time of each Numba layer kernel against the torch ops it replaces, and of a whole forward.

    python -m protospec.bench.layer_kernel_cost [--model JackFram/llama-160m] [--output-json PATH]

Shapes: the model's (dummy weights, float16), batch 1, a context of --context keys, T = 1 (a draft
decode step) and T = k + 1 = 6 (a verify). forward_mma_fused is the layer
kernels' forward with the fused tensor-core GEMVs for its linear layers, its "torch" column the same
forward on cuBLAS. Each case is captured 20 times in one CUDA graph and the
graph replayed; time per case = replay time / 20 (CUDA events): kernels plus the gaps between them,
as the engine's graphs run them.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from protospec.model.attention import paged_attention as torch_attention, plan_attention
from protospec.bench.launch_cost import graph_replay_us
from protospec.bench.provenance import check_writable, provenance, write_report
from protospec.model.inputs import prepare_inputs
from protospec.kernels.linear.layer_ops import add_rms_norm, rope_and_cache, silu_and_mul
from protospec.kernels.attention.paged_attention import paged_attention
from protospec.model.layer_kernels import enable_layer_kernels
from protospec.model.loader import load_model
from protospec.model.llama import apply_rope, rms_norm
from protospec.command_line import CommandParser, run_command


def graph_us(fn, copies: int = 20, replays: int = 20) -> float:
    """Device microseconds per fn() call, fn captured `copies` times in one CUDA graph."""
    return graph_replay_us(fn, copies, replays) / copies


def cases(model, tokens: int, context: int, block_size: int = 16) -> dict[str, tuple]:
    cfg, dev, dtype = model.config, torch.device("cuda"), model.model.embed_tokens.weight.dtype
    heads, kv_heads, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    blocks = -(-(context + tokens) // block_size)
    width = 1 << (blocks - 1).bit_length()  # the graph bucket's power-of-two width
    inputs = prepare_inputs([[5] * tokens], [context], [list(range(1, blocks + 1))], block_size, tokens, dev, width)
    meta, pos = inputs.meta, inputs.positions
    cache = torch.randn(2, width + 1, block_size, kv_heads, d, device=dev).to(dtype)
    x = torch.randn(tokens, cfg.hidden_size, device=dev).to(dtype)
    residual = torch.randn_like(x)
    w = torch.ones(cfg.hidden_size, device=dev, dtype=dtype)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * d, device=dev).to(dtype)
    gate_up = torch.randn(tokens, 2 * cfg.intermediate_size, device=dev).to(dtype)
    q = torch.randn(tokens, heads, d, device=dev).to(dtype)
    cos, sin = model.rope.cos.to(dtype), model.rope.sin.to(dtype)
    rows = torch.arange(tokens, device=dev)
    plan = plan_attention(pos, meta, dtype)
    grid = qkv.view(tokens, -1, d)

    def torch_rope():
        apply_rope(grid[:, : heads + kv_heads], cos[pos][:, None], sin[pos][:, None])

    def torch_write_and_attend():  # write_kv + gather + SDPA: the rest of the torch path's attention
        torch_attention(q, grid[:, heads: heads + kv_heads], grid[:, heads + kv_heads:], cache, meta, plan, d ** -0.5)

    return {
        "add_rms_norm": (lambda: add_rms_norm(x, residual, w, 1e-6, rows), lambda: rms_norm(x + residual, w, 1e-6)),
        # numba: RoPE + K/V write in one kernel; torch: RoPE only (its K/V write is in its attention below)
        "rope_and_cache": (lambda: rope_and_cache(qkv, pos, cos, sin, cache, meta.slot_mapping, heads), torch_rope),
        "attention": (lambda: paged_attention(q, cache, meta.block_tables, pos, tokens, d ** -0.5), torch_write_and_attend),
        "attention_mask_plan": (None, lambda: plan_attention(pos, meta, dtype)),
        "silu_and_mul": (lambda: silu_and_mul(gate_up), lambda: F.silu(gate_up[:, : cfg.intermediate_size]) * gate_up[:, cfg.intermediate_size:]),
        "forward": _forward_case(model, inputs),
        "forward_mma_fused": _fused_linear_case(model, inputs),
        **_sampling_cases(cfg.vocab_size, tokens, dev),
    }


def _sampling_cases(vocab: int, tokens: int, dev) -> dict[str, tuple]:
    """tokens == 1: a draft step's sample into the spec step's buffers; else the verify's probs."""
    from protospec.config import SamplingParams
    from protospec.kernels.sampling.softmax_sample import probs_into, sample_into
    from protospec.speculation.sampler import SamplingTensors, compute_probs, sample

    k = 5
    st = SamplingTensors.build([SamplingParams(temperature=1.0)], [torch.Generator(device=dev)], vocab, dev)
    logits = torch.randn(tokens, vocab, device=dev)
    if tokens > 1:
        out = torch.empty_like(logits)
        return {"verify_probs": (lambda: probs_into(logits, st, out, tokens), lambda: compute_probs(logits, st, rows_per_seq=tokens))}
    noise = torch.empty(1, 2 * k + 1, vocab, device=dev).exponential_()
    draft_ids, draft_probs = torch.zeros(1, k, dtype=torch.int64, device=dev), torch.zeros(1, k, vocab, device=dev)

    def torch_sample():
        ids, probs = sample(logits, st, noise[:, 2])
        draft_ids[:, 2] = ids
        draft_probs[:, 2] = probs

    return {"draft_sample": (lambda: sample_into(logits, st, 2, draft_probs, draft_ids, noise), torch_sample)}


def _caches(model, inputs) -> list[torch.Tensor]:
    """Zeroed per-layer K/V caches wide enough for the inputs' block tables."""
    return [torch.zeros(2, inputs.meta.block_tables.shape[1] + 1, inputs.meta.block_size, model.config.num_key_value_heads,
                        model.config.head_dim, device="cuda", dtype=model.model.embed_tokens.weight.dtype)
            for _ in model.model.layers]


def _forward_case(model, inputs):
    caches = _caches(model, inputs)
    kernels = model.layer_kernels

    def run(use_kernels: bool):
        def fn():
            model.layer_kernels = kernels if use_kernels else None
            model(inputs.input_ids, inputs.positions, caches, inputs.meta)
            model.layer_kernels = kernels
        return fn

    return run(True), run(False)


def _fused_linear_case(model, inputs):
    """The layer kernels' forward with its linear layers on the fused tensor-core GEMV
    (kernels/linear/gemv_mma.py), beside the same forward on cuBLAS (the "torch" column)."""
    from protospec.model.layer_kernels import LayerKernelForward

    on_cublas = _forward_case(model, inputs)[0]
    kernels = model.layer_kernels
    mma = LayerKernelForward(model, linear="mma_fused")
    caches = _caches(model, inputs)

    def fn():
        model.layer_kernels = mma
        model(inputs.input_ids, inputs.positions, caches, inputs.meta)
        model.layer_kernels = kernels
    return fn, on_cublas


def main(argv=None) -> dict:
    p = CommandParser(prog="python -m protospec.bench.layer_kernel_cost", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="JackFram/llama-160m")
    p.add_argument("--context", type=int, default=320, help="keys already cached (256 prompt + ~64 generated)")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 6])
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    check_writable(args.output_json)
    if not torch.cuda.is_available():
        raise SystemExit("layer_kernel_cost needs a CUDA device")
    model = load_model(args.model, load_format="dummy", dtype=torch.float16, device=torch.device("cuda"), extra_positions=8)
    enable_layer_kernels(model)
    report = provenance(torch.device("cuda"), argv, "protospec.bench.layer_kernel_cost") | {"config": vars(args), "us_per_call": {}}
    for tokens in args.tokens:
        rows = {}
        for name, (numba_fn, torch_fn) in cases(model, tokens, args.context).items():
            rows[name] = {"numba": graph_us(numba_fn) if numba_fn else None, "torch": graph_us(torch_fn) if torch_fn else None}
            cells = "   ".join(f"{lib} {'-' if v is None else f'{v:7.2f}'} us" for lib, v in rows[name].items())
            print(f"T={tokens} {name:>20}: {cells}", flush=True)
        report["us_per_call"][f"T={tokens}"] = rows
    write_report(args.output_json, report)
    return report


if __name__ == "__main__":
    run_command(main)
