# The two commands of the README:
#   make demo   set everything up in .venv and start JupyterLab on the demo workspace
#   make test   set everything up in .venv and run every test
# Both are safe to run again: set-up is skipped when nothing it depends on changed.

VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PYTHON ?= python3

DOCS_BUILT   := docs/_build/html/index.html
DOCS_SOURCES := $(wildcard docs/*.md docs/conf.py docs/_templates/*.html docs/images/*.png)

.PHONY: setup demo test checks docs test-load bench bench-scale clean lock test-latest

setup: $(STAMP)

# the lab extension's sources too: an editable install copies the built extension into .venv
# only when it is (re)installed
LAB_SOURCES := $(wildcard labextension/src/*.ts labextension/src/*.tsx labextension/src/components/*.tsx labextension/style/*.css labextension/schema/*.json labextension/package.json)

$(STAMP): pyproject.toml scripts/setup.sh $(wildcard requirements/*.txt) requirements/azurite/package-lock.json labextension/yarn.lock jupyter_portable/worker/wheelset.py jupyter_portable/worker/resolve.py $(LAB_SOURCES)
	PYTHON=$(PYTHON) scripts/setup.sh
	touch $(STAMP)

demo: setup $(DOCS_BUILT)
	$(PY) scripts/demo.py --start

test: setup
	$(MAKE) --no-print-directory checks

# every check of `make test`, without the set-up step
checks:
	$(VENV)/bin/ruff check jupyter_portable tests ui-tests bench scripts
	$(VENV)/bin/mypy jupyter_portable
	# the layers of docs/architecture.md: imports only point down, no cycles
	$(VENV)/bin/lint-imports
	cd labextension && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" jlpm test
	# two workers, a test file each at a time (its module fixtures stay in one process): most
	# tests wait on servers and machines, so two share the 2 cores well; the files in the order
	# tests/conftest.py gives them (the longest first), not xdist's (most tests first)
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=40
	# the browser tests: a pytest run of their own (their conftest is not the one of tests/), on two
	# workers too: each file has its own JupyterLab, workspace and market (its tests in order on one
	# page), each worker its own browser, and most of their time is waiting on idle windows and
	# machines; the longest files first (ui-tests/conftest.py)
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder ui-tests
	# the documentation site, after the browser tests regenerated its screenshots
	$(MAKE) --no-print-directory docs

# the documentation site (docs/) into docs/_build/html; any warning fails the build
docs:
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html

# `make demo` builds the site too (docs/_build/html/index.html, to open beside the demo), again only
# when a page, an image or the configuration changed
$(DOCS_BUILT): $(STAMP) $(DOCS_SOURCES)
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
	touch $(DOCS_BUILT)

# the whole suite 5 times in a row beside one busy loop per core; it must pass 5/5 (RUNS=n for fewer)
test-load: setup
	scripts/test-load.sh

bench: setup
	$(PY) bench/snapshot.py
	$(PY) bench/bootstrap.py

clean:
	rm -rf $(VENV) demo test-output .latest

# refresh the lock files of the project's own environment (requirements/py3.X.txt) to the newest
# versions pyproject.toml allows, less requirements/constraints.txt; then make test, and commit them
lock:
	PYTHON=$(PYTHON) scripts/lock.sh

# the whole suite against the newest versions, in a separate copy of the tree (.latest/): an upstream
# release that breaks something shows here, by name, before it reaches the lock
test-latest:
	PYTHON=$(PYTHON) scripts/test-latest.sh

# a million-file workspace: snapshot, no change, one file changed, restore, verify (not part of make test)
bench-scale: setup
	scripts/bench-tools.sh
	$(PY) bench/scale.py --files $${FILES:-1000000}
