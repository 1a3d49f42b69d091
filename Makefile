# chartcite: two commands on a fresh machine.
#   make demo   installs everything into .venv and serves the demo frame on http://127.0.0.1:5000/
#   make test   installs what the tests need (Chromium from Debian too) and runs the whole suite
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
HOST ?= 127.0.0.1
PORT ?= 5000
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export CHARTCITE_DATA_DIR ?= $(CURDIR)/chartcite-data

.PHONY: demo test install install-test system-test-deps index bench clean services-up services-down

# The venv is kept between runs: torch alone is gigabytes, so it is installed once and re-checked
# only when a lock file changes (the stamp file records that). Every package comes from the lock
# files in requirements/ at its exact version and hash (refresh them with scripts/lock.sh); the
# build tools go first so that the two source-only packages build without fetching anything else.
LOCKED_INSTALL := $(PY) -m pip install --quiet --require-hashes --no-build-isolation

$(VENV)/.installed: requirements/app.lock requirements/build.lock setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes -r requirements/build.lock
	$(LOCKED_INSTALL) -r requirements/app.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

# llama-cpp-python (the local model server the LLM tests run) is built from source once (~10 min
# on 2 cores); pip keeps the built wheel in its cache, so later installs take seconds.
$(VENV)/.installed-test: $(VENV)/.installed requirements/test.lock | system-test-deps
	$(LOCKED_INSTALL) -r requirements/test.lock
	touch $@

install: $(VENV)/.installed

install-test: system-test-deps $(VENV)/.installed-test

# Debian's Chromium for the browser tests (Playwright drives it; it never downloads a browser),
# and the compiler and CMake that build llama-cpp-python.
system-test-deps:
	@command -v chromium >/dev/null 2>&1 && command -v cmake >/dev/null 2>&1 && command -v g++ >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium, cmake and g++ for the tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium cmake g++; }

demo: install
	@echo "chartcite demo: open http://$(HOST):$(PORT)/ and pick a patient"
	CHARTCITE_DEMO_LAUNCH=true $(VENV)/bin/chartcite serve --host $(HOST) --port $(PORT)

index: install
	$(VENV)/bin/chartcite index examples/synthea

# The suite runs against a real Elasticsearch node and a real Redis, started here and stopped
# afterwards even when tests fail.
test: install-test
	@scripts/services.sh up > .services.env
	@set -a; . ./.services.env; set +a; unset CHARTCITE_BACKEND; status=0; started=$$(date +%s); \
	  $(PY) -m pytest || status=$$?; \
	  echo "suite wall time: $$(( $$(date +%s) - started )) s (exit $$status)"; \
	  scripts/services.sh down; rm -f .services.env; exit $$status

services-up:
	@scripts/services.sh up

services-down:
	@scripts/services.sh down

bench: install
	$(PY) bench/ingest.py
	$(PY) bench/ask.py
	$(PY) bench/load.py
	$(PY) bench/first_answer.py
	@scripts/services.sh up > .services.env
	@set -a; . ./.services.env; set +a; status=0; $(PY) bench/elastic.py && \
	  $(PY) bench/load.py --backend elasticsearch || status=$$?; \
	  scripts/services.sh down; rm -f .services.env; exit $$status

clean:
	rm -rf chartcite-data .pytest_cache
