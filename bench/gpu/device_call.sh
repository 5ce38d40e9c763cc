#!/usr/bin/env bash
# One call of the GPU study's lease (issue 23; planned by `python bench/gpu/lease.py pack`).
# Idempotent: each call installs the carried wheels once, keeps the GGUF pieces it brings in
# /tmp/lease (the machine keeps files ~30 s between calls), and imports the model once all pieces
# are there. A carried .gpu/state/runs.tgz (run folders without checkpoints, from an earlier
# lease) is unpacked first: finished runs are reused from their markers.
# Without the model (the first call): the sampler's speed and profile on random weights of
# SmolLM2-135M's shape (bench/gpu/sampler_speed.py at the study's generate shapes); UPDATE_BENCH=1
# adds bench/bench_gpu_update.py's update with and without per-layer torch.compile, and SMOKE=1
# the smoke study on the same weights until DEADLINE (the whole GPU path: spawned CUDA workers
# under MPS, TF32, evaluation on the GPU), whose folder is deleted. Both ran on 2026-11-26.
# With it, until DEADLINE seconds after the start: the study (configs/study_countdown_smollm2.toml,
# WORKERS processes on the one GPU: 7 with >= 120 GiB of GPU memory, else 4); SOLO=1 first adds a
# solo 4-step GRPO run and BASE=1 the base model's pass@1 / pass@64 table (both measured on the
# 2026-11-25 lease).
# The study outlives the call that starts it (setsid; see below): a next call waits for it.
# Every minute and at the end, the run folders without checkpoints go to $OUT/runs.tgz, so a call
# killed at its limit still returns what finished; every 10 s, evaluated runs lose their
# checkpoints and running ones all but their newest optimizer state (lease.py prune). Measured on
# the 2026-11-25 lease (bench/results/gpu_lease_smollm2_2026-11-25.json): 10 workers at
# micro-batch 64 and 512 responses per generate call ran out of an H100's memory; checkpoints
# (1.6 GB each) filled the disk.
# STUDY names the study file (default configs/study_countdown_smollm2.toml). The bf16 gate (on
# the real weights before the study where no call ran it; GATE=0 skips it): the
# first call samples once with eval.dtype = bfloat16 on the GPU (sampler_speed.py, random weights;
# BENCH_DTYPES, default "float32 bfloat16"); unless that passed on this machine, the study's
# confirmation samples in float32 (a copy of STUDY without its confirm_train line). Every call ends
# with $OUT/progress.json (lease.py progress: runs and evaluations done per stage, what is left).
# STACKED_BENCH=1 times the stacked sampler against generate on the real weights before the study
# (issue 36 item 2; sampler_speed.py --samplers generate stacked, ~40 s).
# SHARPENING_GIT_COMMIT names the commit the study records (the device's copy of .git holds the
# session's first HEAD, not the tree sent): pass the one here, `git rev-parse HEAD`, in the command.
# Usage there: DEADLINE=540 bash bench/gpu/device_call.sh
set -uo pipefail
START=$(date +%s)
DEADLINE=${DEADLINE:-540}
OUT=${OUT:-gpu_out}
LEASE=/tmp/lease
STUDY=${STUDY:-configs/study_countdown_smollm2.toml}
MEM_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
# An evaluating worker holds ~17 GiB (1,024 responses per generate call, fp32 KV cache of a
# 207-token prompt): 10 of them ran an H200 (140 GiB) out of memory on the 2026-11-26 lease.
WORKERS=${WORKERS:-$([ "${MEM_MIB:-0}" -ge 122880 ] && echo 7 || echo 4)}
mkdir -p "$OUT" "$LEASE" runs/gpu
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
# The SmolLM2 study's runs of leases 1-4 were trained under numerics version 2's arithmetic (a
# constant group's float32 residual kept; numerics.EXACT_CENTRING is version 3); the runs that
# finish it share that arithmetic, or the adopted runs would not be reused
# (llm.orchestrate.jobs._same_numerics). Another study may set SHARPENING_NUMERICS=pinned.
export SHARPENING_NUMERICS=${SHARPENING_NUMERICS:-pinned-v2}
# Less fragmentation across 8 processes; but vLLM's sleep-mode allocator refuses expandable
# segments at start-up (llm.rollout.vllm_engine.check_alloc_conf), so not where vLLM runs: a
# study or base config that names backend = "vllm", or VLLM=1.
if [ "${VLLM:-0}" = 1 ] || grep -qs 'backend *= *"vllm"' "$STUDY" configs/countdown_smollm2_gpu.toml; then
  unset PYTORCH_CUDA_ALLOC_CONF
else
  export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
fi
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
  df -h . | tail -1
} > "$OUT/device.txt" 2>&1
# CUDA MPS lets the workers' small kernels run side by side instead of time-sliced. Started once
# (a daemon outlives the call); if a CUDA client cannot start under it, it is stopped for good.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
if [ "${MPS:-1}" = 1 ] && [ ! -f "$LEASE/mps.failed" ]; then
  mkdir -p /tmp/mps_pipe /tmp/mps_log
  pgrep -f nvidia-cuda-mps-control > /dev/null || nvidia-cuda-mps-control -d
  if timeout 60 python3 -c "import torch; print('MPS client ok', float((torch.ones(8, device='cuda') * 2).sum()))"; then
    echo "mps on" >> "$OUT/device.txt"
  else
    echo quit | nvidia-cuda-mps-control; touch "$LEASE/mps.failed"; echo "mps failed" >> "$OUT/device.txt"
  fi
fi
cat "$OUT/device.txt"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 5 > "$OUT/gpu_util.csv" 2>&1 &
SMI=$!
pack() {  # everything but checkpoints, weights and optimizer states; tmp + rename: never half
  local tmp="$LEASE/runs.$BASHPID.tgz"  # the keeper's and the final pack never share a file
  tar czf "$tmp" --exclude=checkpoints --exclude='*.safetensors' --exclude='*.pt' \
    --exclude=smoke runs/gpu 2>/dev/null
  # tar exits 1 when a file changed while it was read (a running study's logs): the archive is
  # whole, and the finished runs in it do not change.
  [ $? -le 1 ] && mv "$tmp" "$OUT/runs.tgz"
}
# Every 10 s: evaluated runs lose their checkpoints (disk); every ~60 s: a fresh $OUT/runs.tgz.
( i=0; while sleep 10; do
    python3 bench/gpu/lease.py prune runs/gpu > /dev/null
    i=$((i + 1)); [ $((i % 6)) = 0 ] && pack
  done ) &
KEEPER=$!
finish() {
  kill "$SMI" "$KEEPER" 2>/dev/null
  python3 bench/gpu/lease.py progress runs/gpu/study --out "$OUT/progress.json" > /dev/null
  pack; ls -la "$OUT"; df -h . | tail -1
}

if [ -f .gpu/state/runs.tgz ] && [ ! -d runs/gpu/study ]; then
  tar xzf .gpu/state/runs.tgz && log "unpacked the run folders of an earlier lease"
fi
python3 bench/gpu/lease.py gather --into "$LEASE/gguf"
if [ ! -f models/smollm2-135m-instruct/model.safetensors ] && [ ! -d .gpu/shape ]; then
  log "no model yet, and no .gpu/shape carried: no sampler bench, no bf16 gate"
  finish
  exit 0
fi
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
  if [ ! -f "$LEASE/bench.done" ]; then
    # float32 (the exploration's evaluations) against bfloat16 (the confirmation's: the study's
    # confirm_train), each timed apart from its profiled call (docs/gpu.md, The sampler).
    for dtype in ${BENCH_DTYPES:-float32 bfloat16}; do
      log "sampler speed, $dtype"
      timeout 90 python3 bench/gpu/sampler_speed.py --model models/smollm2-random --device cuda \
        --tf32 --dtype "$dtype" --config configs/countdown_smollm2_gpu.toml \
        --shapes ${BENCH_SHAPES:-16x8 32x32} --profile "${BENCH_PROFILE:-25}" \
        --out "$OUT/sampler_speed_$dtype.json" > "$OUT/sampler_$dtype.txt" 2>&1
      rc=$?
      [ "$dtype" = bfloat16 ] && { [ $rc = 0 ] && touch "$LEASE/bf16.ok" || touch "$LEASE/bf16.failed"; }
      log "rc=$rc"; grep -v Warning "$OUT/sampler_$dtype.txt" | grep -E "^ *(sampler|generate|stacked) "
    done
    modes=(); [ "${UPDATE_BENCH:-0}" = 1 ] && modes=(eager --compile)
    for mode in "${modes[@]}"; do
      compile=$([ "$mode" = --compile ] && echo --compile)
      log "update $mode"
      timeout 120 python3 bench/bench_gpu_update.py --configs configs/countdown_smollm2_gpu.toml \
        --groups 16 --prompt-tokens 180 --repeats 3 --peak-tflops 494.7 $compile \
        --set system.tf32=true system.gradient_checkpointing=true system.micro_batch_size=32 \
        --out "$OUT/bench_update.jsonl" 2>&1 | grep -v Warning | tail -2
    done
    touch "$LEASE/bench.done"
  fi
  [ "${SMOKE:-0}" = 1 ] || { finish; exit 0; }
  python3 bench/gpu/lease.py smoke models/smollm2-random /tmp/lease/smoke.toml
  timeout "$(( $(left) > 30 ? $(left) : 30 ))" python3 -m llm --debug study \
    --config /tmp/lease/smoke.toml --workers "$WORKERS" --out runs/gpu/smoke > runs/gpu/smoke.log 2>&1
  log "smoke study rc=$?"
  grep -v Warning runs/gpu/smoke.log | tail -25
  tar czf "$OUT/smoke.tgz" --exclude=checkpoints runs/gpu/smoke runs/gpu/smoke.log
  rm -rf runs/gpu/smoke  # 1.6 GB per run: the study needs the disk
  finish
  exit 0
fi

if [ "${SOLO:-0}" = 1 ] && [ ! -f runs/gpu/solo/metrics.jsonl ]; then
  log "solo run"
  timeout 90 python3 -m llm train --config configs/countdown_smollm2_gpu.toml --out runs/gpu/solo \
    --set steps=4 rollout.prompts_per_step=16 system.tf32=true system.gradient_checkpointing=true \
    system.micro_batch_size=32 run.save_every=100 2>&1 | grep -v Warning | tail -3
  rm -rf runs/gpu/solo/checkpoints
fi
if [ "${BASE:-0}" = 1 ] && [ ! -f runs/gpu/base_passk.json ]; then
  log "base pass@k table"
  timeout 150 python3 bench/gpu/base_passk.py --model models/smollm2-135m-instruct \
    --config configs/countdown_smollm2_gpu.toml --device cuda --problems 128 --samples 64 \
    --prompts-per-batch 16 --variants 2:1-20:1-100 3:1-20:1-100 4:1-20:1-100 2:1-50:1-200 \
    --out runs/gpu/base_passk.json 2>&1 | grep -v Warning | tail -6
fi
if [ "${GATE:-1}" = 1 ] && [ ! -f "$LEASE/bf16.ok" ] && [ ! -f "$LEASE/bf16.failed" ] \
   && grep -q '^confirm_train' "$STUDY"; then
  # The bf16 gate on the real weights, where the first call carried no .gpu/shape (the tree left
  # no room): one evaluation-sized sampling call in bfloat16 (~20 s). GATE=0 skips it, for a
  # lease that only explores (the exploration samples in float32).
  log "bf16 gate on the model"
  timeout 90 python3 bench/gpu/sampler_speed.py --model models/smollm2-135m-instruct --device cuda \
    --tf32 --dtype bfloat16 --config configs/countdown_smollm2_gpu.toml --shapes 32x32 \
    --out "$OUT/sampler_speed_bfloat16.json" > "$OUT/sampler_bfloat16.txt" 2>&1 \
    && touch "$LEASE/bf16.ok" || touch "$LEASE/bf16.failed"
  log "bf16 gate: $(ls "$LEASE" | grep -o 'bf16\.[a-z]*')"
fi
if [ ! -f "$LEASE/bf16.ok" ] && grep -q '^confirm_train' "$STUDY"; then
  # The gate did not pass on this machine: the confirmation samples in float32.
  fp32="$(dirname "$STUDY")/_fp32_$(basename "$STUDY")"
  grep -v '^confirm_train' "$STUDY" > "$fp32" && STUDY=$fp32
  log "bf16 gate not passed here: the confirmation samples in float32 ($STUDY)"
fi
if [ "${STACKED_BENCH:-0}" = 1 ] && [ ! -f "$LEASE/stacked.done" ] \
   && [ -d models/smollm2-135m-instruct ]; then
  # Issue 36 item 2: the stacked sampler (eval.sampler = "stacked") against transformers' generate
  # at the evaluation's call, bfloat16, the real weights (~40 s; before the study starts, so the
  # GPU is idle). It only informs: a study samples with it only if its config says so.
  log "stacked sampler against generate"
  timeout 120 python3 bench/gpu/sampler_speed.py --model models/smollm2-135m-instruct --device cuda \
    --tf32 --dtype bfloat16 --config configs/countdown_smollm2_gpu.toml --shapes 32x32 \
    --samplers generate stacked --out "$OUT/sampler_speed_stacked.json" \
    > "$OUT/sampler_stacked.txt" 2>&1
  log "rc=$?"; grep -E "^ *(sampler|generate|stacked) " "$OUT/sampler_stacked.txt"
  touch "$LEASE/stacked.done"
fi
# The study runs in a session of its own (setsid), so it outlives this call: a call that returns
# at its DEADLINE leaves it running, and the next call on the warm machine (any carry; the machine
# keeps /tmp and the ignored runs/ between calls) finds it by its PID and waits for it instead of
# starting another, so no run is cut between calls. A call after it has ended starts the study
# again, which reuses every finished run from its marker and goes on where it stopped.
PIDFILE=$LEASE/study.pid
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
  log "the study an earlier call started (PID $(cat "$PIDFILE")) is still running: waiting for it"
else
  log "the study $STUDY ($WORKERS workers)"
  setsid bash -c 'echo $$ > "$0"; exec python3 -m llm --debug study --config "$1" \
    --workers "$2" --out runs/gpu/study' "$PIDFILE" "$STUDY" "$WORKERS" \
    >> runs/gpu/study.log 2>&1 < /dev/null &
  sleep 2
fi
while kill -0 "$(cat "$PIDFILE" 2>/dev/null)" 2>/dev/null && [ "$(left)" -gt 20 ]; do sleep 5; done
if kill -0 "$(cat "$PIDFILE" 2>/dev/null)" 2>/dev/null; then
  log "the study runs on (PID $(cat "$PIDFILE")): a next call on the warm machine waits for it"
else
  log "the study ended"
fi
grep -v Warning runs/gpu/study.log | tail -30
finish
