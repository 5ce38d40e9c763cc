#!/usr/bin/env bash
# One call of the GPU study's lease (issue 23; planned by `python bench/gpu/lease.py pack`).
# Idempotent: each call installs the carried wheels once, keeps the GGUF pieces it brings in
# /tmp/lease (the machine keeps files ~30 s between calls), and imports the model once all pieces
# are there. Without the model it runs the smoke study on random weights of SmolLM2-135M's shape
# (the whole GPU path: spawned CUDA workers, TF32, evaluation on the GPU, pruning); with it:
#   1. a solo 4-step GRPO run (step time and where it goes, rollout tokens/s; nothing else running),
#   2. the base model's pass@1 / pass@64 on Countdown variants (bench/gpu/base_passk.py), beside
#   3. the study (configs/study_countdown_smollm2.toml, 8 workers on the one GPU) until DEADLINE
#      seconds after the start; then everything but checkpoints is packed into $OUT.
# Usage there: DEADLINE=540 bash bench/gpu/device_call.sh
set -uo pipefail
START=$(date +%s)
DEADLINE=${DEADLINE:-540}
OUT=${OUT:-gpu_out}
LEASE=/tmp/lease
WORKERS=${WORKERS:-8}
mkdir -p "$OUT" "$LEASE" runs/gpu
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
left() { echo $(( DEADLINE - ($(date +%s) - START) )); }
log() { echo "[$(( $(date +%s) - START ))s] $*"; }

if [ ! -f "$LEASE/site.ok" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$LEASE/site" \
    .gpu/wheels/*.whl && touch "$LEASE/site.ok"
fi
export PYTHONPATH=$PWD:$LEASE/site
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.version.cuda)"
  git rev-parse HEAD 2>/dev/null || echo "commit unknown"
  df -h . | tail -1
} > "$OUT/device.txt" 2>&1
cat "$OUT/device.txt"
# CUDA MPS lets the workers' small kernels run side by side instead of time-sliced. Started once
# (a daemon outlives the call); if a CUDA client cannot start under it, it is stopped for good.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
if [ "${MPS:-1}" = 1 ] && [ ! -f "$LEASE/mps.failed" ]; then
  mkdir -p /tmp/mps_pipe /tmp/mps_log
  pgrep -x nvidia-cuda-mps-control > /dev/null || nvidia-cuda-mps-control -d
  if timeout 60 python3 -c "import torch; print('MPS client ok', float((torch.ones(8, device='cuda') * 2).sum()))"; then
    echo "mps on" >> "$OUT/device.txt"
  else
    echo quit | nvidia-cuda-mps-control; touch "$LEASE/mps.failed"; echo "mps failed" >> "$OUT/device.txt"
  fi
fi
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/gpu_util.csv" 2>&1 &
SMI=$!

pack() {  # everything but checkpoints, weights and optimizer states
  kill "$SMI" 2>/dev/null
  [ -d runs/gpu ] && tar czf "$OUT/runs.tgz" --exclude=checkpoints --exclude='*.safetensors' \
    --exclude='*.pt' runs/gpu
  ls -la "$OUT"
}

python3 bench/gpu/lease.py gather --into "$LEASE/gguf"
if [ ! -f models/smollm2-135m-instruct/model.safetensors ]; then
  log "no model yet: the smoke study on random weights of its shape"
  if [ ! -f models/smollm2-random/model.safetensors ]; then
    python3 - <<'PY'
import shutil, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = Path(".gpu/shape"), Path("models/smollm2-random")
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32)
model.save_pretrained(dst)
for f in src.iterdir():
    if f.name != "config.json":
        shutil.copy(f, dst / f.name)
PY
  fi
  python3 bench/gpu/lease.py smoke models/smollm2-random /tmp/lease/smoke.toml
  timeout "$(( $(left) > 30 ? $(left) : 30 ))" python3 -m llm --debug study --config /tmp/lease/smoke.toml --workers "$WORKERS" \
    --out runs/gpu/smoke > runs/gpu/smoke.log 2>&1
  log "smoke study rc=$?"
  grep -v Warning runs/gpu/smoke.log | tail -25
  [ -f runs/gpu/smoke/study.json ] && touch "$LEASE/smoke.ok"
  pack
  exit 0
fi

if [ ! -f runs/gpu/solo/metrics.jsonl ]; then
  log "solo run"
  timeout 90 python3 -m llm train --config configs/countdown_smollm2_gpu.toml --out runs/gpu/solo \
    --set steps=4 rollout.prompts_per_step=16 system.tf32=true system.gradient_checkpointing=true \
    system.micro_batch_size=64 run.save_every=100 \
    2>&1 | grep -v Warning | tail -6
  rm -rf runs/gpu/solo/checkpoints
fi
log "base pass@k table (background) and the study"
[ -f "$OUT/base_passk.json" ] || python3 bench/gpu/base_passk.py --model models/smollm2-135m-instruct \
  --config configs/countdown_smollm2_gpu.toml --device cuda --problems 128 --samples 64 \
  --prompts-per-batch 16 --variants 2:1-20:1-100 3:1-20:1-100 4:1-20:1-100 2:1-50:1-200 \
  --out runs/gpu/base_passk.json > runs/gpu/base_passk.log 2>&1 &
( while sleep 10; do python3 bench/gpu/lease.py prune runs/gpu/study > /dev/null; done ) &
PRUNER=$!
timeout "$(( $(left) > 60 ? $(left) - 20 : 40 ))" python3 -m llm --debug study --config configs/study_countdown_smollm2.toml \
  --workers "$WORKERS" --out runs/gpu/study > runs/gpu/study.log 2>&1
log "study rc=$?"
kill "$PRUNER" 2>/dev/null
grep -v Warning runs/gpu/study.log | tail -30
cat runs/gpu/base_passk.log 2>/dev/null | tail -6
pack
