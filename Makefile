# Two commands on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch; on a GPU machine: `make setup TORCH=torch` (or the build your CUDA needs).
# Where pip would otherwise fetch a CUDA build, add TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH ?= torch==2.13.0
TORCH_INDEX ?=
PIP := $(BIN)/pip --disable-pip-version-check

.PHONY: setup demo test test-slow test-all test-busy lint check bench gpu-check docs dist-check clean

setup: $(VENV)/.installed

# the venv, pip and torch: what every target below starts from
$(VENV)/.torch: Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet "$(TORCH)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	touch $@

# what `make demo` needs and no more: pitstop (editable), transformers for the demo's tiny Llama, and NVML's
# small binding for the GPU samples on a GPU machine; the test and docs tools come with `make setup`
$(VENV)/.demo: $(VENV)/.torch pyproject.toml setup.py src/pitstop/trace/_eventloop.c
	$(PIP) install --quiet -e ".[demo,nvml]"
	touch $@

# DeepSpeed (for the launcher tests) builds from an sdist that imports torch: built against the torch above,
# with no ops compiled, so pip never fetches a second (CUDA) torch
DEEPSPEED ?= deepspeed==0.19.8

# everything for development: the Hugging Face stack, the test tools and what the tests drive, the docs tools
# (a superset of the demo's: its stamp too)
$(VENV)/.installed: $(VENV)/.torch pyproject.toml setup.py src/pitstop/trace/_eventloop.c
	$(PIP) install --quiet -e ".[hf,nvml,dev,docs]"
	$(PIP) install --quiet wheel
	DS_BUILD_OPS=0 $(PIP) install --quiet --no-build-isolation "$(DEEPSPEED)"
	touch $@ $(VENV)/.demo

demo: $(VENV)/.demo
	$(BIN)/pitstop doctor --demo --fixed

lint: setup
	$(BIN)/ruff check src tests bench tools
	$(BIN)/ruff format --check src tests bench tools
	$(BIN)/mypy

# tests run on WORKERS processes (pytest-xdist; worksteal: an idle worker takes queued tests from a busy one)
WORKERS ?= 2
XDIST := -n $(WORKERS) --dist worksteal
# the slowest tests named at the end of each tier: where CI's minutes go
DURATIONS := --durations=25 --durations-min=5

# the fast tier: lint, types, every test that starts no process, and one real run per front door (smoke)
test: lint
	$(BIN)/pytest $(XDIST) -m "not slow or smoke"

# the rest: every test that starts a process or trains, but the smoke runs `make test` already ran
test-slow: setup
	$(BIN)/pytest $(XDIST) $(DURATIONS) -m "slow and not smoke"

# everything, each test once (CI runs this)
test-all: test test-slow

bench: setup
	$(BIN)/python bench/probe_overhead.py

# the whole suite with two CPU-bound processes beside it (Debian's stress-ng), as on a busy shared machine
test-busy: lint
	@command -v stress-ng >/dev/null || { echo "stress-ng is missing: apt-get install stress-ng"; exit 2; }
	stress-ng --cpu 2 --quiet & pid=$$!; $(BIN)/pytest $(PYTEST_ARGS); rc=$$?; kill $$pid; exit $$rc

# every GPU path checked on a real GPU, one pass/fail table (skips cleanly without CUDA); not part of CI
# ONLY=activity runs only the checks whose names match (pytest's -k)
gpu-check: setup
	$(BIN)/python bench/gpu_check.py $(ONLY)

# the documentation site into site/: docs/causes.md must match the code, and --strict fails on any warning
# (a broken link or anchor, a page missing from the nav)
docs: setup
	$(BIN)/python tools/gen_causes.py --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# the sdist and the wheel, each installed in a fresh venv away from the checkout; the wheel runs the demo
dist-check: setup
	tools/dist_check.sh $(BIN)/python "$(TORCH)" "$(TORCH_INDEX)"

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site build/dist-check
