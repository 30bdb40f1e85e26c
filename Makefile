PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test demo bench fuzz lint format clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip >/dev/null
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

test: $(STAMP)
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
