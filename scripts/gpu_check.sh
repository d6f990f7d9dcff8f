#!/usr/bin/env bash
# GPU check: a short training on the GPU with the transformers engine and the small model the
# project makes itself (no download), policy in bf16; prints rollout and update seconds per
# step and peak GPU memory for grpo and dots_rr. Needs a CUDA GPU and `make install` done.
#   bash scripts/gpu_check.sh [extra -S overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${DOTS_GPU_CHECK_ROOT:-/tmp/dots-gpu-check}
export HF_HUB_OFFLINE=1
.venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible to torch')"
.venv/bin/dots all -S paths.root="$ROOT" -S tracking.enabled=false -S train.device=cuda -S model.dtype=bfloat16 \
  -S train.steps=60 -S eval.every=20 -S warmup.steps=1000 -S rollout.batch_size=4096 "$@"
.venv/bin/python - "$ROOT" <<'PY'
import json, sys, torch
root = sys.argv[1]
print(f"GPU: {torch.cuda.get_device_name(0)}")
print(f"{'method':8} {'rollout s/step':>15} {'update s/step':>14} {'step s':>8} {'peak GPU GB':>12} {'final acc':>10}")
for m in ("grpo", "dots_rr"):
    s = json.load(open(f"{root}/runs/{m}/summary.json"))
    print(f"{m:8} {s['mean:time/rollout_s']:15.4f} {s['mean:time/update_s']:14.4f} {s['mean:time/step_s']:8.4f} "
          f"{s.get('gpu_peak_memory_gb', float('nan')):12.3f} {s['final_accuracy']:10.4f}")
PY
