# Two commands do all the set-up: `make run` (the pipeline on the embedded default) and `make test`.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
CONFIG ?= configs/tiny-arith.yaml
PYTEST_ARGS ?=

.PHONY: run test test-fast install clean

install: $(VENV)/.installed

# torch goes in first, pinned, so the CPU wheel is used and no CUDA packages are pulled in.
$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BIN)/pip install -q -e ".[test]"
	touch $@

run: install
	$(BIN)/grpo-pipeline run --config $(CONFIG)

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: install
	$(BIN)/python -m pytest -q -m "not integration" $(PYTEST_ARGS)

clean:
	rm -rf runs .prefect
