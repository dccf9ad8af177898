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

## make bench: the CPU benchmark at the issue's sizes (about 20 min; writes bench-results/*.json),
## the optimisation ladder at n = 4096, and every chapter widget's live redraw time
bench: $(STAMP)
	$(BIN)/python -m flashlib.bench cpu --n 1024 4096 16384 --causal --repeats 5 \
		--blocks 64x64,128x64,128x128,256x256
	$(BIN)/python -m flashlib.bench ladder --n 4096
	$(BIN)/python scripts/widget_redraw.py

clean:
	rm -rf _build
