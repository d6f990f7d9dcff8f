#!/usr/bin/env bash
# GPU check, one prepared run of under 8 minutes on one GPU (the lent H200: PyTorch and
# transformers, no vLLM, no network). The transformers engine throughout.
#   1. scripts/memory_probe.py --gpu: a random-initialised model with Qwen2.5-1.5B's shapes and
#      vocabulary, built locally, bf16; micro-batched updates of G = 8 answers of 1,536 tokens
#      (activation checkpointing, chunked log-probs) for B = 4, 8, 16 and two budgets, and one
#      rollout of 64 x 512 tokens: seconds, tokens per second and peak memory beside the plan.
#   2. the embedded pipeline in bf16 on the GPU, micro-batched: a short `dots all` (grpo, dots_rr).
#   bash scripts/gpu_check.sh            (writes logs and JSON under $OUT, default /tmp/dots-gpu-check)
# Before the device call, here: bash scripts/gpu_wheels.sh (pydantic, which the image lacks), and
# carry .gpu_wheels. tests/test_gpu_check.py runs both steps on the CPU without the packages the
# image lacks, so a new import or a renamed key shows up in the suite, not in the device minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
OUT=${OUT:-/tmp/dots-gpu-check}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
# a machine without our venv (the lent GPU has torch and transformers only): carried wheels
if ! $PY -c "import pydantic" 2>/dev/null && [ -d .gpu_wheels ]; then
  $PY -m pip install -q --no-index --find-links .gpu_wheels pydantic
fi
$PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible to torch')"
$PY - <<'PY'
import torch, transformers
print(f"GPU: {torch.cuda.get_device_name(0)}, {torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB; "
      f"torch {torch.__version__}, transformers {transformers.__version__}")
PY
echo "== 1. Qwen2.5-1.5B shapes: micro-batched update and rollout against the plan"
$PY scripts/memory_probe.py --gpu --json "$OUT/probe.json" 2>&1 | tee "$OUT/probe.log"

echo "== 2. embedded pipeline, bf16, micro-batched, on the GPU"
ROOT="$OUT/embedded"
timeout "${EMBEDDED_TIMEOUT:-240}" $PY -m dots.cli all -S paths.root="$ROOT" -S tracking.enabled=false \
  -S train.device=cuda -S model.dtype=bfloat16 -S train.deterministic=false \
  -S warmup.steps=200 -S "warmup.checkpoints=[100,150]" -S "label.policies=[step100,step150,final]" \
  -S label.num_questions=1024 -S train.steps=20 -S eval.every=10 -S rollout.batch_size=4096 \
  -S train.micro_batch_tokens=4096 -S "train.methods=[grpo,dots_rr]" "$@" 2>&1 | tee "$OUT/embedded.log"
$PY - "$ROOT" <<'PY'
import json, sys
root = sys.argv[1]
print(f"{'method':8} {'rollout s/step':>15} {'update s/step':>14} {'step s':>8} {'peak GPU GB':>12} {'final acc':>10}")
for m in ("grpo", "dots_rr"):
    s = json.load(open(f"{root}/runs/{m}/summary.json"))
    print(f"{m:8} {s['mean:time/rollout_s']:15.4f} {s['mean:time/update_s']:14.4f} {s['mean:time/step_s']:8.4f} "
          f"{s.get('gpu_peak_memory_gb', float('nan')):12.3f} {s['final_accuracy']:10.4f}")
PY
