# Two commands matter: `make book` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Benchmarks and tests pin their own threads; keep BLAS from oversubscribing the 2 cores.
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: book test notebooks lab lint bench clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

## make book: execute every chapter and build the static site into _build/html
book: $(STAMP)
	$(BIN)/jupyter-book build . -W -n --keep-going

## make test: the whole suite (numerics, notebooks in sync, lint, browser tests on the built site)
test: book
	$(BIN)/python -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

## make notebooks: regenerate the clean .ipynb copies in notebooks/ from book/
notebooks: $(STAMP)
	$(BIN)/python scripts/notebooks.py write

## make lab: open the notebooks in JupyterLab with flashlib importable
lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/

lint: $(STAMP)
	$(BIN)/ruff check .

## make bench: the CPU benchmark at the book's sizes (writes bench-results/)
bench: $(STAMP)
	$(BIN)/python -m flashlib.bench cpu

clean:
	rm -rf _build
