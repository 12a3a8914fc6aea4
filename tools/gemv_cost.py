"""Device time of one decode-shaped linear layer against its bytes floor: the tensor-core GEMV
(kernels/linear/gemv_mma.py, key "mma") beside torch's (cuBLAS). A CUDA-core Numba GEMV was timed here too
and lost at every shape; it was retired (NOTES.md names the commit it lived in).

    python -m tools.gemv_cost [--shapes 768x2304 768x6144 3072x768 768x768 768x32000]
                                        [--tokens 1 6] [--norm] [--output-json PATH]

A shape KxN is nn.Linear(K, N): weight [N, K] float16, x [tokens, K] float16. Floor = (weight + x + y
bytes) / the copy bandwidth of the same run. Each case is 20 calls captured in one CUDA graph and
replayed; the calls cycle through enough weight copies to exceed the L2 cache 4x, so each call reads
its weight from memory as a forward does (a layer's weight is not in L2 when its turn comes).
--norm also times the RMSNorm folded into the tensor-core GEMV (one kernel) against
layer_ops.add_rms_norm followed by cuBLAS (two), the pair a decoder layer runs before its QKV and
gate/up projections.
"""
from __future__ import annotations

import argparse
import itertools

import torch

from tools.attention_cost import CALLS_PER_GRAPH, L2_BYTES, cuda_and_copy_bandwidth, time_calls
from protospec.bench.provenance import check_writable, provenance, write_report
from protospec.kernels.linear import gemv_mma, layer_ops
from protospec.command_line import CommandParser, run_command

SHAPES = ("768x2304", "768x6144", "3072x768", "768x768", "768x32000")  # llama-160m: qkv, gate_up, down, o, lm_head


def weight_copies(k: int, n: int, dev) -> list[torch.Tensor]:
    copies = max(2, min(CALLS_PER_GRAPH, -(-4 * L2_BYTES // (k * n * 2))))
    return [torch.randn(n, k, device=dev).div_(k ** 0.5).half() for _ in range(copies)]


def main(argv=None) -> dict:
    p = CommandParser(prog="python -m tools.gemv_cost", description=__doc__,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), help="KxN (in x out features)")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 6], help="token rows (1 = decode, k + 1 = verify)")
    p.add_argument("--norm", action="store_true", help="also time RMSNorm folded in against norm + cuBLAS")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    check_writable(args.output_json)
    dev, bandwidth = cuda_and_copy_bandwidth("gemv_cost")
    report = provenance(dev, argv, "tools.gemv_cost") | {
        "config": vars(args), "copy_bandwidth_gbs": bandwidth, "cases": []}
    print(f"{'shape':>10} {'tokens':>6} {'floor us':>8} {'torch us':>8} {'x floor':>7} | numba: us (x floor)")
    for shape, tokens in itertools.product(args.shapes, args.tokens):
        k, n = (int(v) for v in shape.split("x"))
        weights = weight_copies(k, n, dev)
        x = torch.randn(tokens, k, device=dev).half()
        floor_us = (k * n + tokens * (k + n)) * 2 / bandwidth / 1e3
        torch_us = time_calls([lambda w=w: torch.nn.functional.linear(x, w) for w in weights])
        row = {"shape": shape, "tokens": tokens, "floor_us": floor_us, "torch_us": torch_us, "numba": {}}
        expected = torch.nn.functional.linear(x.float(), weights[0].float())
        applies = gemv_mma.supports(k) and tokens <= gemv_mma.MAX_ROWS
        if applies:  # tensor cores (key "mma")
            err = float((gemv_mma.gemv_mma(x, weights[0]).float() - expected).abs().max())
            us = time_calls([lambda w=w: gemv_mma.gemv_mma(x, w) for w in weights])
            row["numba"]["mma"] = {"us": us, "x_floor": us / floor_us, "max_abs_err": err}
        if args.norm and applies:
            g = torch.ones(k, device=dev, dtype=torch.float16)
            rows_idx = torch.arange(tokens, device=dev)
            row["norm_fused_us"] = time_calls([lambda w=w: gemv_mma.gemv_mma(x, w, norm_weight=g) for w in weights])
            row["norm_then_cublas_us"] = time_calls([lambda w=w: torch.nn.functional.linear(
                layer_ops.add_rms_norm(x, None, g, 1e-6, rows_idx)[0], w) for w in weights])
        report["cases"].append(row)
        best = " ".join(f"{v}: {e['us']:.2f} ({e['x_floor']:.1f})" for v, e in row["numba"].items())
        norm = (f" | norm folded {row['norm_fused_us']:.2f} vs norm + cuBLAS {row['norm_then_cublas_us']:.2f}"
                if "norm_fused_us" in row else "")
        print(f"{shape:>10} {tokens:>6} {floor_us:>8.2f} {torch_us:>8.2f} {torch_us / floor_us:>7.1f} | {best}{norm}", flush=True)
        del weights
    write_report(args.output_json, report)
    return report


if __name__ == "__main__":
    run_command(main)
