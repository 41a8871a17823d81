# clawq — `make demo` and `make test` work from a fresh clone with nothing but Python.
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin

.PHONY: install demo test bench lint clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/.installed

demo: install  ## a scripted agent job across real worker processes (embedded Redis/PostgreSQL)
	$(BIN)/clawq demo

test: install  ## the whole suite: needs Redis on :6379 and PostgreSQL on :5432 (see .ci/run)
	$(BIN)/pytest

bench: install  ## round trip, throughput and 1,000 concurrent jobs, against baselines
	$(BIN)/python -m bench

lint: install
	$(BIN)/ruff check broker workers orchestrator tests bench
	$(BIN)/mypy broker workers orchestrator

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
