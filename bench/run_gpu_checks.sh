#!/usr/bin/env bash
# The GPU checks of issue 14 item 1 in one command (no vLLM, random weights, nothing downloaded):
# the device, the `-m gpu` tests that need no vLLM, and bench/bench_gpu_update.py on the one-GPU
# paper configs, the 7B config (expected not to fit one GPU) and the DSDR config without the
# chunked output head. Writes everything under ${OUT:-gpu_checks}/.
#
#   bash bench/run_gpu_checks.sh            # on a CUDA machine with torch + transformers
# Missing pure-Python packages can be given as wheels in .whl/ (installed with --no-deps).
set -uo pipefail
OUT=${OUT:-gpu_checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.version.cuda)"
} 2>&1 | tee "$OUT/device.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider tests/llm/test_trainer.py tests/llm/test_vllm_backend.py \
  2>&1 | tee "$OUT/pytest_gpu.txt" | tail -15
python3 bench/bench_gpu_update.py --out "$OUT/bench_gpu_update.jsonl" 2>&1 | tail -8
python3 bench/bench_gpu_update.py --configs configs/math_qwen25_math_7b_casp.toml --groups 1 \
  --out "$OUT/bench_gpu_update.jsonl" 2>&1 | tail -3
python3 bench/bench_gpu_update.py --configs configs/math_qwen3_1p7b_dsdr.toml --logit-chunk 0 \
  --out "$OUT/bench_gpu_update.jsonl" 2>&1 | tail -3
