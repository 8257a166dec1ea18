# The two commands of the README: `make demo` (the main job) and `make test` (every test, real services).
# Everything they need is installed by the project's own scripts; caches live in $(TOKENPOOLS_CACHE).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
export TOKENPOOLS_CACHE ?= $(HOME)/.cache/tokenpools

.PHONY: install services demo test test-live test-unit test-image image lint bench clean

# The mypyc accelerator (admission, replayer, simulator: tokenpools/accel.py) is rebuilt when a source changed.
install: $(VENV)/.installed
	VENV=$(VENV) scripts/build-accel.sh

$(VENV)/.installed: pyproject.toml tools/pyproject.toml scripts/bootstrap.sh
	PYTHON=$(PYTHON) VENV=$(VENV) scripts/bootstrap.sh
	touch $@

services:
	scripts/install-services.sh

demo: install
	$(VENV)/bin/tokenpools demo --out out/demo

lint: install
	VENV=$(VENV) scripts/lint.sh

test-unit: install
	$(VENV)/bin/python -m pytest tests/unit -q

# The image tests are their own target: a cold image build (debootstrap, wheels) alone is ~10 min on 2 cores.
test: install services lint
	$(VENV)/bin/python -m pytest -q -rfER --reruns 2 --reruns-delay 2 -m "not image"

# The container image tokenpools:<version> in the local containers storage (root: debootstrap + buildah; no Docker).
image: $(VENV)/.installed
	PYTHON=$(VENV)/bin/python scripts/build-image.sh

# Builds the image (warm: 1-3 min; cold: ~10 min) and runs it with podman: --version and a proxy smoke test.
test-image: install services
	$(VENV)/bin/python -m pytest -q -rfER -m image tests/integration/test_image.py

# Only the compressed live experiments (Exp 1 and Exp 2 through the whole stack), a few minutes.
test-live: install services
	$(VENV)/bin/python -m pytest -q tests/integration/test_live_exp1.py tests/integration/test_live_exp2.py

bench: install services
	$(VENV)/bin/python benchmarks/admission.py
	$(VENV)/bin/python benchmarks/replay_speed.py

clean:
	rm -rf $(VENV) out .pytest_cache .hypothesis
