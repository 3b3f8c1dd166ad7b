# The README's two commands: `make run` (default scenario) and `make test`; `make lint` for development
# (docs/development.md), which CI runs too: code checks, and the documentation site built strictly;
# `make docs` builds the site alone.
PY ?= python3

.PHONY: install run test test-fast lint docs

install:
	@# torch first, pinned: an unpinned resolve would pull a multi-GB CUDA build
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -q -e ".[test]"

run: install
	$(PY) -m emulator scenario=dropout.yaml

test: install
	$(PY) -m pytest -q -n auto --dist loadgroup

test-fast: install   # every module in under two minutes; what it leaves out: tests/slow.py
	$(PY) -m pytest -q -n auto --dist loadgroup -m "not slow"

lint: install
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m mkdocs build --strict --quiet   # broken links or anchors, pages left out of the nav: mkdocs.yml

docs: install   # the site in site/, its figures drawn from real runs first (docs/figures.py)
	$(PY) -m pip install -q -e ".[docs]"
	$(PY) -m mkdocs build --strict
