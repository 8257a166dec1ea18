# The two commands of the README: `make demo` (the main job) and `make test` (every test, real services).
# Everything they need is installed by the project's own scripts; caches live in $(TOKENPOOLS_CACHE).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
export TOKENPOOLS_CACHE ?= $(HOME)/.cache/tokenpools

.PHONY: install services demo test test-live test-unit lint bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/bootstrap.sh
	PYTHON=$(PYTHON) VENV=$(VENV) scripts/bootstrap.sh
	touch $@

services:
	scripts/install-services.sh

demo: install
	$(VENV)/bin/tokenpools demo --out out/demo

lint: install
	$(VENV)/bin/lint-imports

test-unit: install
	$(VENV)/bin/python -m pytest tests/unit -q

# The compressed live Exp 1 smoke depends on the machine's load (see its module): run it with `make test-live`.
test: install services lint
	$(VENV)/bin/python -m pytest -q --reruns 2 --reruns-delay 2 --ignore=tests/integration/test_live_exp1.py

test-live: install services
	$(VENV)/bin/python -m pytest -q --reruns 1 tests/integration/test_live_exp1.py

bench: install services
	$(VENV)/bin/python benchmarks/admission.py
	$(VENV)/bin/python benchmarks/replay_speed.py

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
