PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test demo bench fuzz lint format clean

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

setup: $(STAMP)

test: $(STAMP) $(NODE_SERVER)
	$(BIN)/ruff check visor tests
	$(BIN)/python -m pytest -q

demo: $(STAMP)
	$(BIN)/visor demo

bench: $(STAMP)
	$(BIN)/visor bench

lint: $(STAMP)
	$(BIN)/ruff check visor tests
	$(BIN)/ruff format --check visor tests

format: $(STAMP)
	$(BIN)/ruff format visor tests
	$(BIN)/ruff check --fix visor tests

clean:
	rm -rf $(VENV) build *.egg-info
