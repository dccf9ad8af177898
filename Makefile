# Two commands matter: `make book` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Silences a debugger warning that Jupyter kernels print when they start.
export PYDEVD_DISABLE_FILE_VALIDATION := 1

.PHONY: book catalogs book-student student-notebooks test check notebooks lab lint bench constraints clean grade

# PYTHONWARNINGS: setuptools prints a warning box on every editable install ("Editable
# installation": folders named like the package may shadow it), even with --quiet.
$(STAMP): requirements.txt constraints.txt pyproject.toml
	test -x $(BIN)/pip || $(PYTHON) -m venv --clear $(VENV)
	$(BIN)/python -m pip install --quiet pip==26.3
	$(BIN)/python -m pip install --quiet -r requirements.txt -c constraints.txt
	PYTHONWARNINGS="ignore:Editable installation" \
		$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

## make book: execute every chapter and build the static site into _build/html, the English
## edition at its root and the Japanese one (tools/ja_edition.py: the same chapters and their
## executed outputs, translated through locales/ja) under _build/html/ja
# Sphinx and the execution cache only notice changes to the chapters themselves (and to files
# they literalinclude); when flashlib changes (its .py and its widgets' .js), every glued
# number and figure must be recomputed, so the build starts afresh.
# The book's Sphinx extension and theme templates shape every page: a change rebuilds too.
FLASHLIB_HASH := $(shell find flashlib tools/book_extension.py tools/i18n_extension.py book/_templates -type f \
	\( -name '*.py' -o -name '*.js' -o -name '*.html' \) | LC_ALL=C sort | xargs cat \
	| sha256sum | cut -c1-16)
KERNEL_MISSES = _build/i18n-kernel-misses.jsonl
book: $(STAMP)
	@if [ "$$(cat _build/.flashlib-hash 2>/dev/null)" != "$(FLASHLIB_HASH)" ]; then \
		echo "flashlib or the book's extension changed: rebuilding and re-executing every chapter"; rm -rf _build; fi
	@mkdir -p _build && touch $(KERNEL_MISSES)  # the kernels list there what they drew in Japanese untranslated
	FLASHLIB_I18N_RECORD=$(CURDIR)/$(KERNEL_MISSES) $(BIN)/jupyter-book build . -W -n --keep-going
	$(BIN)/python -m tools.ja_edition build
	echo "$(FLASHLIB_HASH)" > _build/.flashlib-hash

## make catalogs: after changing the English text, update the Japanese edition's catalogs
## (locales/ja/LC_MESSAGES/: new entries empty, changed ones fuzzy; `make test` refuses both
## until they are translated: python -m tools.catalogs check)
catalogs: $(STAMP)
	$(BIN)/python -m tools.ja_edition catalogs

## make book-student: the student edition of the site, every solution removed
## (tools/student_edition.py), into _build/student/_build/html; after `make book`, whose
## execution cache it reads (it executes nothing)
book-student: book
	FLASHLIB_STUDENT_EDITION=1 $(BIN)/jupyter-book build . -W -n --keep-going \
		--path-output _build/student

## make student-notebooks: the student notebooks' repository (notebooks/student/ and flashlib's
## wheel, no solution), into _build/student-notebooks, to publish with the release as
## <repository>-student: the student edition's Colab links and set-up cells point there
student-notebooks: $(STAMP)
	$(BIN)/python -m tools.student_notebooks build _build/student-notebooks

## make grade SUBMISSIONS=folder [OUT=grading-report] [GRADE_ARGS=...]: run the students'
## notebooks through the book's checkers (grading/, python -m grading; reports in OUT)
OUT ?= grading-report
grade: $(STAMP)
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=folder [OUT=dir]" >&2; exit 2; }
	$(BIN)/python -m grading "$(SUBMISSIONS)" --out "$(OUT)" $(GRADE_ARGS)

## make test: the whole suite (numerics, notebooks in sync, lint, import contracts, packaging in
## fresh venvs, browser tests on the built site)
test: book book-student
	FLASHLIB_REQUIRE_ALL=1 $(BIN)/python -m pytest; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; exit $$rc

## make check: the fast loop while editing (under 3 minutes on 2 cores): ruff, the import
## contracts, and every test that needs no built site, no browser and no fresh virtual
## environment (pytest -m "not site and not student_site and not browser and not slow")
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -m "not site and not student_site and not browser and not slow"

## make notebooks: regenerate the clean .ipynb copies in notebooks/ from book/, and the
## student edition's (no solutions) in notebooks/student/
notebooks: $(STAMP)
	$(BIN)/python -m tools.notebooks write

## make lab: open your copies of the notebooks (lab/, ignored by git) in JupyterLab with
## flashlib importable; chapters changed since are refreshed unless you edited them.
## make lab EDITION=ja: the Japanese notebooks, in lab/ja/ (日本語版)
EDITION ?= en
lab: $(STAMP)
	$(BIN)/python -m tools.lab --lang $(EDITION)
	$(BIN)/jupyter lab lab/ $$([ "$$(id -u)" = 0 ] && echo --allow-root)

## make lint: ruff and the import contracts (pyproject.toml [tool.importlinter])
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

## make bench: the tracked figures against their targets (flashlib.bench.targets: one thread
## and every core against PyTorch, large logits, the backward), the CPU benchmark at the
## issue's sizes, the optimisation ladder at n = 4096 (long; writes bench-results/*.json), then
## every chapter widget's live redraw time (book tooling: tools/widget_redraw.py).  Run it on
## an idle machine.  OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which some machines set to force a
## slower kernel, are unset for these commands only (never for the tests or CI).
BENCH := env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BIN)/python -m flashlib.bench
bench: $(STAMP)
	$(BENCH) targets --n 4096 --repeats 5
	$(BENCH) targets --n 4096 --repeats 5 --causal --out bench-results/targets-causal.json
	$(BENCH) targets --n 4096 --repeats 5 --d 128 --out bench-results/targets-d128.json
	$(BENCH) targets --n 4096 --repeats 5 --d 128 --causal \
		--out bench-results/targets-d128-causal.json
	$(BENCH) cpu --n 1024 4096 16384 --causal --repeats 5
	$(BENCH) ladder --n 4096
	$(BIN)/python -m tools.widget_redraw

## make constraints: re-pin every package of the environment after changing requirements.txt
constraints: $(STAMP)
	{ sed -n '1,3p' constraints.txt; $(BIN)/pip freeze --exclude-editable | grep -v '^flashlib' \
		| sed 's/^torch==\(.*\)+cpu/torch==\1/'; \
		$(BIN)/pip freeze --all | grep -E '^(setuptools|wheel)=='; } > constraints.tmp
	mv constraints.tmp constraints.txt

clean:
	rm -rf _build
