# clawq — `make demo` and `make test` work from a fresh clone with nothing but Python.
VENV   ?= .venv
PYTHON ?= python3
BIN     = $(VENV)/bin

.PHONY: install demo test bench chaos lint clean system

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/.installed

demo: install  ## a scripted agent job across real worker processes (embedded Redis/PostgreSQL)
	$(BIN)/clawq demo

system:  ## the machine's part: podman, runc, busybox-static, chromium, bubblewrap, Redis, PostgreSQL
	bash tests/system-packages.sh

test: install system  ## the whole suite, on real services and components (nothing is skipped)
	$(BIN)/pytest

bench: install  ## round trip, throughput and 1,000 concurrent jobs, against baselines
	$(BIN)/python -m bench

CHAOS_JOBS    ?= 100
CHAOS_MINUTES ?= 5
chaos: install system  ## faults of every kind at random for minutes while jobs run: lost / repeated, recovery per fault
	$(BIN)/python -m tests.chaos --jobs $(CHAOS_JOBS) --minutes $(CHAOS_MINUTES)

lint: install
	$(BIN)/ruff check broker workers orchestrator tests bench
	$(BIN)/mypy broker workers orchestrator

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache *.egg-info
