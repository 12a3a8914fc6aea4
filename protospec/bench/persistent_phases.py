"""Where the persistent decode forward's time goes: each phase's device time against its bytes floor.

    python -m protospec.bench.persistent_phases [--model JackFram/llama-68m] [--tokens 1] [--context 320]
                                                [--launches 200] [--threads 256]
                                                [--output-json PATH]

Dummy float16 weights, --tokens sequences of --context cached keys each. A TIMELINE build of the
kernel (kernels/persistent_decode.py) stamps the GPU's clock after every phase from block 0, which
leaves a phase only at the grid sync that ends it, so a phase's time here includes that sync; the
means are over --launches launches (%globaltimer ticks coarser than some phases; the mean is not).
Beside them: the plain kernel's time per forward replayed from a CUDA graph (20 forwards per graph),
the same phases launched as one ordinary kernel each (kernels/phase_kernels.py) and the layer
kernels' forward the same way, the weights' bytes over the measured copy bandwidth, and the
compiled kernel's registers and local memory per thread (local memory would mean spilled registers).
"""
from __future__ import annotations

import argparse

import torch

from protospec.bench.attention_cost import copy_bandwidth_gbs
from protospec.bench.layer_kernel_cost import graph_us
from protospec.bench.provenance import check_writable, provenance, write_report
from protospec.kernels import interop, persistent_decode
from protospec.model.inputs import prepare_inputs
from protospec.model.loader import load_model
from protospec.model.persistent_forward import PersistentDecodeForward


def phase_bytes(cfg, tokens: int, context: int, itemsize: int) -> dict[str, int]:
    """Bytes each phase must read at least: its weights (and, for attention, the K/V it attends over)."""
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    per_layer = {"qkv": (heads + 2 * kv_heads) * d * h, "attention": tokens * (context + 1) * kv_heads * d * 2,
                 "o": h * heads * d, "gate_up": 2 * i * h, "down": h * i}
    out = {}
    for layer in range(cfg.num_hidden_layers):
        out |= {f"layer{layer}.{k}": v * itemsize for k, v in per_layer.items()}
    out["layer0.qkv"] += tokens * h * itemsize  # layer 0's QKV phase reads the embedding rows
    return out | {"lm_head": cfg.vocab_size * h * itemsize}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(prog="python -m protospec.bench.persistent_phases", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="JackFram/llama-68m")
    p.add_argument("--tokens", type=int, default=1, help="sequences, one decode token each")
    p.add_argument("--context", type=int, default=320, help="keys already cached per sequence")
    p.add_argument("--launches", type=int, default=200)
    p.add_argument("--threads", type=int, nargs="+", default=[persistent_decode.THREADS], help="threads per block")
    p.add_argument("--output-json", default=None)
    args = p.parse_args(argv)
    check_writable(args.output_json)
    if not torch.cuda.is_available():
        raise SystemExit("persistent_phases needs a CUDA device")
    dev = torch.device("cuda")
    model = load_model(args.model, load_format="dummy", dtype=torch.float16, device=dev, extra_positions=8)
    model.enable_layer_kernels()
    cfg, block_size = model.config, 16
    per_launch = persistent_decode.tokens_per_launch(cfg.hidden_size, cfg.num_attention_heads * cfg.head_dim,
                                                     cfg.intermediate_size)
    if args.tokens > per_launch:  # the timeline would show the last launch only
        raise SystemExit(f"--tokens {args.tokens}: one launch of this model's kernel takes {per_launch}")
    blocks = -(-(args.context + 1) // block_size)
    tables = [list(range(1 + s * blocks, 1 + (s + 1) * blocks)) for s in range(args.tokens)]
    inputs = prepare_inputs([[5]] * args.tokens, [args.context] * args.tokens, tables, block_size, 1, dev)
    meta = inputs.meta
    kv = (torch.randn(cfg.num_hidden_layers, 2, args.tokens * blocks + 1, block_size, cfg.num_key_value_heads,
                      cfg.head_dim, device=dev) * 0.5).half()
    run_args = (inputs.input_ids, inputs.positions, meta.slot_mapping, meta.block_tables.contiguous(), kv)

    names = persistent_decode.phase_names(cfg.num_hidden_layers)
    bandwidth = copy_bandwidth_gbs(dev)
    nbytes = phase_bytes(cfg, args.tokens, args.context, 2)
    floor_us = sum(nbytes.values()) / bandwidth / 1e3
    caches = list(kv.clone().unbind(0))
    layered_us = graph_us(lambda: model(inputs.input_ids, inputs.positions, caches, meta))
    report = provenance(dev, argv, "protospec.bench.persistent_phases") | {
        "config": vars(args), "copy_bandwidth_gbs": bandwidth, "floor_us": floor_us, "layer_kernels_us": layered_us,
        "by_threads": {}}
    for threads in args.threads:
        timed = PersistentDecodeForward(model, timeline=True, threads=threads)
        stamps = []
        for _ in range(args.launches):
            timed.forward(*run_args)
            stamps.append(timed.timeline.clone())
        gaps = torch.stack(stamps).diff(dim=1).double().mean(dim=0).div(1e3).tolist()  # [phases] us
        phases = {n: {"us": us, "bytes": nbytes[n], "floor_us": nbytes[n] / bandwidth / 1e3} for n, us in zip(names, gaps)}
        plain = PersistentDecodeForward(model, threads=threads)
        forward_us = graph_us(lambda: plain.forward(*run_args))
        per_phase = PersistentDecodeForward(model, threads=threads, launches="per_phase")
        per_phase_us = graph_us(lambda: per_phase.forward(*run_args))
        resources = interop.compiled_resources(plain.kernel, threads)
        report["by_threads"][threads] = {"grid_blocks": plain.blocks, "kernel_resources": resources, "phases": phases,
                                         "forward_us": forward_us, "per_phase_launches_us": per_phase_us,
                                         "sum_of_phases_us": sum(gaps)}
        print(f"threads {threads}, grid {plain.blocks}; resources {resources}")
        print(f"{'phase':<18}{'us':>9}{'floor us':>10}{'x floor':>9}")
        for name, row in phases.items():
            print(f"{name:<18}{row['us']:9.2f}{row['floor_us']:10.2f}{row['us'] / row['floor_us']:9.1f}")
        print(f"forward (graph): persistent {forward_us:.1f} us (phases sum {sum(gaps):.1f}), the same phases as "
              f"one kernel each {per_phase_us:.1f} us, layer kernels {layered_us:.1f} us, floor {floor_us:.1f} us")
    write_report(args.output_json, report)
    return report


if __name__ == "__main__":
    from protospec.command_line import run_command

    run_command(main)
