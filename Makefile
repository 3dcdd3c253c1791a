# Two commands do all the set-up: `make run` (the pipeline on the embedded default) and `make test`.
# `make docs` builds the documentation site (docs/, mkdocs.yml) into site/.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0
CONFIG ?= configs/tiny-arith.yaml
PYTEST_ARGS ?=
# The tests run in parallel, one pytest-xdist worker per core, each file whole on one worker (its module and session
# fixtures are built once), the slowest files first (tests/conftest.py). PYTEST_WORKERS=1 runs them in one process.
PYTEST_WORKERS ?= auto

.PHONY: run test test-slow test-fast test-postgres test-vllm test-ray test-benchmarks gpu-check lint docs docs-serve install serve stop status clean

# bubblewrap isolates model-written programs in the code reward's sandbox (docs/rewards.md); without it, as root,
# the sandbox refuses to run them. Installed where we can (root on Debian/Ubuntu); never fails the install.
install: $(VENV)/.installed
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing bubblewrap (isolates the code sandbox)"; \
	    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
	      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }; } \
	      || echo "could not install bubblewrap; the code sandbox needs it to run programs as root: apt-get install bubblewrap"; \
	  else \
	    echo "bubblewrap is not installed; the code sandbox isolates programs with it: sudo apt-get install bubblewrap (Debian/Ubuntu) or sudo dnf install bubblewrap (Fedora)"; \
	  fi; \
	}

# torch goes in first, pinned, so the CPU wheel is used and no CUDA packages are pulled in.
$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==$(TORCH_VERSION)
	$(BIN)/pip install -q -e ".[test,docs]"
	touch $@

run: install
	$(BIN)/grpo-pipeline run --config $(CONFIG)

# The local production stack on loopback (Prefect + MLflow servers, work pools, deployments, workers).
serve: install
	$(BIN)/grpo-pipeline serve

stop: install
	$(BIN)/grpo-pipeline stop

status: install
	$(BIN)/grpo-pipeline status

# Lint first, then every test but the tiers: the ones that need more than this environment (test-postgres,
# test-vllm, every test marked `ray`, which test-ray runs) and the slow tier (test-slow). What stays covers every
# stage and each real component at least once: the Prefect server (the stack, conftest's prefect_api), the MLflow
# server (the stack, tests/test_register.py), the code sandbox, a multi-process run without Ray
# (tests/test_distributed.py, tests/test_decisions_agree.py), a rehearsal (the GSM8K and coding recipes). It prints
# the 25 slowest tests, so a test that grows past a minute is seen; tests/conftest.py's SLOWEST_FIRST orders files.
PYTEST_PARALLEL = $(if $(filter-out 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: install lint
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) --durations=25 --ignore=tests/test_stack_postgres.py --ignore=tests/test_ray.py -m "not ray and not slow and not benchmarks" $(PYTEST_ARGS)

# The slow tier: tests marked `slow`, each most of a minute or more of pipeline runs, beyond what `make test`'s ten
# minutes hold: the rehearsals of the recipes' LoRA, QLoRA, multi-GPU and tools variants, a pipeline SIGKILLed and
# resumed, an MLflow outage, two pipelines at once, a second difficulty-filtered round, the flow run from Python, a
# user reward module's edits, the rounds' lineage and a round that returns its start, and on the stack a cancelled
# pipeline, a failed GRPO child and a GPU worker sharing nothing but two URLs. .ci/run runs it after `make test`.
test-slow: install
	$(BIN)/python -m pytest -q $(PYTEST_PARALLEL) --durations=25 --ignore=tests/test_stack_postgres.py --ignore=tests/test_ray.py -m "slow and not ray" $(PYTEST_ARGS)

# The benchmarks tier: every script in benchmarks/ once at its smallest settings (tests/test_benchmarks_smoke.py), so
# a change that breaks one fails here; minutes of pipeline runs, one after another. Scripts that need Ray (run as
# root), vLLM's environment or a GPU use what the tiers above installed, or say why they were skipped. vLLM's CPU
# engine takes 1 GiB for its KV cache, as in the vLLM tier (by default it reserves 92% of the machine's memory).
test-benchmarks: install
	VLLM_CPU_KVCACHE_SPACE=1 $(BIN)/python -m pytest -q -m benchmarks tests/test_benchmarks_smoke.py $(PYTEST_ARGS)

# The PostgreSQL tier: the stack's record-writing tests again with both servers on a private PostgreSQL server
# (tests/test_stack_postgres.py; skipped, with the reason, where PostgreSQL's server programs are not installed).
test-postgres: install
	$(BIN)/python -m pytest -q tests/test_stack_postgres.py $(PYTEST_ARGS)

# The vLLM tier: vLLM's CPU build in its own environment (.venv-vllm; tests/vllm_env.sh says why): evaluation
# through vLLM, GRPO with colocated vLLM rollouts, a recipe rehearsed with both (tests/test_vllm.py).
VLLM_VENV ?= .venv-vllm
$(VLLM_VENV)/.installed: pyproject.toml tests/vllm_env.sh
	bash tests/vllm_env.sh $(PYTHON) $(VLLM_VENV) $(TORCH_VERSION)

test-vllm: $(VLLM_VENV)/.installed
	VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -q tests/test_vllm.py $(PYTEST_ARGS)

# The GPU check (benchmarks/gpu_check.py, under 8 minutes on one GPU): GRPO steps with colocated vLLM, evaluation
# through vLLM, bf16 autocast, QLoRA (bitsandbytes), two-process DDP where two GPUs are present; one summary line.
# It needs the gpu extra (vLLM's CUDA build, bitsandbytes, DeepSpeed) in the project's environment, installed once;
# where there is no CUDA device it says what it would measure and fails before installing anything.
$(VENV)/.gpu-installed: $(VENV)/.installed
	$(BIN)/python benchmarks/gpu_check.py --preflight
	$(BIN)/pip install -q -e ".[gpu]"
	touch $@

gpu-check: install $(VENV)/.gpu-installed
	$(BIN)/python benchmarks/gpu_check.py

# The Ray tier: the `ray` extra (Ray Train), then every test marked `ray`, among them SFT and GRPO as Ray Train jobs
# (tests/test_ray.py: a round split across a two-node cluster, killed and resumed; the recipe on a local cluster).
$(VENV)/.ray-installed: $(VENV)/.installed
	$(BIN)/pip install -q -e ".[test,ray]"
	touch $@

test-ray: $(VENV)/.ray-installed
	$(BIN)/python -m pytest -q -m ray $(PYTEST_ARGS)

# Unit tests only: no server, no sandbox, no pipeline run (well under a minute).
test-fast: install
	$(BIN)/python -m pytest -q -m "not integration and not benchmarks" $(PYTEST_ARGS)

# Lint: ruff, the layering contracts and the docs site. lint-imports checks the contracts in pyproject.toml
# ([tool.importlinter]). It finds a package's modules by walking the package's one folder, while `grpo_pipeline`
# spans the folders pyproject's package-dir maps into it; so it reads them through a tree of links in the installed
# shape (build/import-tree), from inside that tree. mkdocs --strict fails on a broken link or anchor and on a page
# missing from the nav (not --quiet: it silences the warnings that --strict counts, and the build then passes).
IMPORT_TREE := build/import-tree
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf $(IMPORT_TREE) && mkdir -p $(IMPORT_TREE)/grpo_pipeline
	ln -s $(CURDIR)/grpo_pipeline/*.py $(IMPORT_TREE)/grpo_pipeline/
	$(BIN)/python -c 'import tomllib; [print(k.split(".", 1)[1], v) for k, v in tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"].items()]' \
	  | while read name folder; do ln -s $(CURDIR)/$$folder $(IMPORT_TREE)/grpo_pipeline/$$name; done
	cd $(IMPORT_TREE) && $(abspath $(BIN))/lint-imports --config $(CURDIR)/pyproject.toml --no-cache --no-logo
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The documentation site into site/ (docs/configuration-reference.md is generated: configs/reference.py says how).
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict

clean:
	rm -rf runs .prefect .grpo-stack site
