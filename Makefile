PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test demo bench fuzz eval lint format clean go-toolchain services

NODE_SERVER := $(VENV)/node/node_modules/.bin/mcp-server-filesystem

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip >/dev/null
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# The npm reference filesystem server, for the tests that check Visor's pack
# against its real tools/list. Installed into the venv, never globally.
$(NODE_SERVER):
	command -v npm >/dev/null || { echo "npm is needed for the filesystem reference server (apt-get install npm)"; exit 1; }
	npm install --silent --no-audit --no-fund --prefix $(VENV)/node @modelcontextprotocol/server-filesystem

# The MCP conformance suite and the stdio-to-HTTP bridge it is run through
# (tests/conformance/). Pinned, installed into the venv, never globally. Where
# npm cannot fetch them, say so: the conformance test then skips with the reason.
CONFORMANCE := $(VENV)/node/node_modules/.bin/conformance
CONFORMANCE_PACKAGES := @modelcontextprotocol/conformance@0.1.12 supergateway@4.0.0

conformance-tools:
	@test -x $(CONFORMANCE) -a -x $(VENV)/node/node_modules/.bin/supergateway || \
	{ command -v npm >/dev/null && npm install --silent --no-audit --no-fund --save-exact \
		--prefix $(VENV)/node $(CONFORMANCE_PACKAGES); } || \
	echo "note: npm could not install $(CONFORMANCE_PACKAGES); the conformance test will skip"

# The suite's server scenarios against our conformance server, bridged by
# supergateway directly and through `visor run`: nothing may be lost through Visor.
conformance: $(STAMP) conformance-tools
	$(BIN)/python -m pytest -q -rs tests/conformance

setup: $(STAMP)

# Go, for the differential tests against a real encoding/json server
# (tests/differential/test_go_server.py). Debian's golang-go, where apt can
# install it; without it those tests skip and say why.
go-toolchain:
	@command -v go >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -q golang-go >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q golang-go >/dev/null 2>&1; }; }; } || \
		echo "note: go could not be installed; the Go differential tests will skip"

# redis-server and nginx, for the shared-state and gateway tests (tests/state, and
# the replicas behind nginx). Debian packages, where apt can install them; without
# them those tests skip and name the package.
services:
	@command -v redis-server >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -q redis-server >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q redis-server >/dev/null 2>&1; }; }; } || \
		echo "note: redis-server could not be installed; the shared-state tests will skip"
	@command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		{ apt-get install -y -q nginx-light >/dev/null 2>&1 || apt-get install -y -q nginx >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && { apt-get install -y -q nginx-light >/dev/null 2>&1 || \
		    apt-get install -y -q nginx >/dev/null 2>&1; }; }; }; } || \
		echo "note: nginx could not be installed; the tests behind nginx will skip"

# What mypy checks: the whole package (strict where pyproject.toml says so).
MYPY_PATHS := visor

# tests/eval needs AgentDojo, which only `make eval` installs: it runs there.
# The suite runs on every core (pytest-xdist), but for the conformance comparison: it runs three
# suites of its own at once, and beside it other tests' waits for a server stretch tenfold.
test: $(STAMP) $(NODE_SERVER) go-toolchain services conformance-tools
	$(BIN)/ruff check visor tests
	$(BIN)/ruff format --check visor tests
	$(BIN)/python -m mypy $(MYPY_PATHS)
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --durations=15 --ignore=tests/eval --ignore=tests/conformance
	$(BIN)/python -m pytest -q -rs tests/conformance

# The demo needs Visor and its runtime dependencies only, not the test extras.
demo:
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	test $(VENV)/.installed-demo -nt pyproject.toml || \
		{ $(BIN)/python -m pip install -q -e . && touch $(VENV)/.installed-demo; }
	$(BIN)/visor demo

# Bytecode compiled first: start-up rows must not pay for compiling Visor on every start (an
# installed wheel is compiled by pip; an editable install under PYTHONDONTWRITEBYTECODE never is).
bench: $(STAMP)
	$(BIN)/python -m compileall -q visor
	$(BIN)/visor bench
	$(BIN)/python -m visor.bench.http_rows

# Every fuzz target for FUZZ_SECONDS each (default 60); non-zero on any crash.
# atheris (coverage-guided) is installed here; the runner falls back to a
# hypothesis driver, and says so, where it cannot be.
FUZZ_SECONDS ?= 60
fuzz: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[fuzz]' || echo "note: atheris could not be installed; using the fallback driver"
	FUZZ_SECONDS=$(FUZZ_SECONDS) $(BIN)/python -m tests.fuzz.run

# AgentDojo's workspace suite (v1.2.2) replayed without a model through a real
# visor run (visor/eval/); writes docs/efficacy.md. AgentDojo is installed here
# only (the eval extra), never for make test. EVAL_LIMIT=N: the first N user tasks.
eval: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[eval]'
	$(BIN)/python -m pytest -q tests/eval
	$(BIN)/python -m visor.eval.agentdojo_replay

lint: $(STAMP)
	$(BIN)/ruff check visor tests
	$(BIN)/ruff format --check visor tests

format: $(STAMP)
	$(BIN)/ruff format visor tests
	$(BIN)/ruff check --fix visor tests

clean:
	rm -rf $(VENV) build *.egg-info
