"""The persistent decode forward's build variants timed at one shape (llama-68m, one token, 320 keys):
python3 scripts/device/persistent_variants.py [--threads 256] [--v-keys 32 16 8] [--lm-rows 4 2]
  --v-keys   persistent_phases.V_KEYS_PER_LOAD: V rows the attention loads together
  --lm-rows  persistent_decode.LM_HEAD_ROWS: LM head rows per warp item
Per variant: us per forward replayed from a CUDA graph, registers and spill bytes per thread."""
import argparse
import itertools

import torch

from protospec.bench.layer_kernel_cost import graph_us
from protospec.kernels import interop, persistent_decode, persistent_phases
from protospec.model.inputs import prepare_inputs
from protospec.model.loader import load_model
from protospec.model.persistent_forward import PersistentDecodeForward

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, nargs="+", default=[persistent_decode.THREADS])
p.add_argument("--v-keys", type=int, nargs="+", default=[persistent_phases.V_KEYS_PER_LOAD])
p.add_argument("--lm-rows", type=int, nargs="+", default=[persistent_decode.LM_HEAD_ROWS])
p.add_argument("--context", type=int, default=320)
args = p.parse_args()
dev = torch.device("cuda")
model = load_model("JackFram/llama-68m", load_format="dummy", dtype=torch.float16, device=dev, extra_positions=8)
cfg, block_size = model.config, 16
blocks = -(-(args.context + 1) // block_size)
inputs = prepare_inputs([[5]], [args.context], [list(range(1, blocks + 1))], block_size, 1, dev)
kv = (torch.randn(cfg.num_hidden_layers, 2, blocks + 1, block_size, cfg.num_key_value_heads, cfg.head_dim,
                  device=dev) * 0.5).half()
run_args = (inputs.input_ids, inputs.positions, inputs.meta.slot_mapping, inputs.meta.block_tables.contiguous(), kv)
reference = None
print("threads v_keys lm_rows | us per forward | regs, spill bytes | max |logit diff| vs the first variant")
for threads, v_keys, lm_rows in itertools.product(args.threads, args.v_keys, args.lm_rows):
    persistent_phases.V_KEYS_PER_LOAD, persistent_decode.LM_HEAD_ROWS = v_keys, lm_rows
    forward = PersistentDecodeForward(model, threads=threads)
    logits = forward.forward(*run_args).clone()
    reference = logits if reference is None else reference
    us = graph_us(lambda: forward.forward(*run_args))
    res = interop.compiled_resources(forward.kernel, threads)[0]
    print(f"{threads:7d} {v_keys:6d} {lm_rows:7d} | {us:14.1f} | {res['regs_per_thread']}, {res['local_mem_per_thread']} | "
          f"{(logits - reference).abs().max().item():.2e}")
