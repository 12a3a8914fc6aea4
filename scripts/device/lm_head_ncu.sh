#!/usr/bin/env bash
# The tensor-core LM head alone: each form's us per call against its bytes floor, then Nsight Compute
# on the fused head form (layer_kernels.HEAD_NORM = "fused": a dependent, final norm after the residual
# add, gathered rows, float32 logits; its 4th launch, 6 token rows). Text under $OUT/res; about two minutes.
#   PROTOSPEC_GIT_COMMIT=<sha> bash scripts/device/lm_head_ncu.sh
set -uo pipefail
source "$(dirname "$0")/env.sh"
mkdir -p "$OUT/res"
timeout 150 python3 scripts/device/lm_head_profile.py 2>&1 | quiet | tee "$OUT/res/lm_head_forms.txt"
timeout 300 ncu --clock-control none --kernel-name regex:gemv_mma_k768_norm_residual_gather_dep_prefetch \
  --launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
  --section WarpStateStats --section SchedulerStats --section LaunchStats \
  python3 scripts/device/lm_head_profile.py --once --tokens 6 > "$OUT/res/lm_head_ncu.txt" 2>&1
grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Achieved Occupancy|Registers Per|Waves Per SM|Warp Cycles Per Issued" \
  "$OUT/res/lm_head_ncu.txt" | head -20
