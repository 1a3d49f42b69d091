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
# on 2 cores) with these flags, not the processor's own: a native build on a Xeon with AMX runs
# ggml's AMX kernels, whose first multi-token prompt killed the server there (issue 39), while an
# AMD EPYC ran AVX2 ones. AVX2, FMA and F16C (every x86-64 server since 2013) and nothing newer:
# both families run the same kernels. The server's log says what was built in
# ("system_info: ... CPU : SSE3 = 1 | ... AVX2 = 1 | ...", with no AVX512 or AMX).
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_BMI2=ON \
  -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF \
  -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
# pip caches the wheel it built under the source archive's address, whatever the flags were: the
# wheels built with these flags get a pip cache of their own, named by the flags, so a change of
# flags builds anew (once) instead of reinstalling a wheel built with the old ones.
LLAMA_BUILD := $(shell printf '%s' '$(LLAMA_CMAKE_ARGS)' | sha256sum | cut -c1-12)
LLAMA_PIP_CACHE ?= $(HOME)/.cache/chartcite/pip-llama-$(LLAMA_BUILD)
LLAMA_INSTALL := CMAKE_ARGS='$(LLAMA_CMAKE_ARGS)' $(LOCKED_INSTALL) --cache-dir '$(LLAMA_PIP_CACHE)'

$(VENV)/.installed-test: $(VENV)/.installed requirements/test.lock | system-test-deps
	$(LLAMA_INSTALL) -r requirements/test.lock
	touch $@

# A venv whose llama-cpp-python was built with other flags (or before they were set) gets it rebuilt
# with these, and the build is checked: no AVX-512 or AMX kernels in the library.
$(VENV)/.llama-$(LLAMA_BUILD): $(VENV)/.installed-test
	grep -A1 '^llama-cpp-python==' requirements/test.lock > $(VENV)/llama-cpp-python.lock
	$(LLAMA_INSTALL) --no-deps --force-reinstall -r $(VENV)/llama-cpp-python.lock
	$(PY) scripts/llama_build.py
	rm -f $(VENV)/.llama-* && touch $@

install: $(VENV)/.installed

install-test: system-test-deps $(VENV)/.installed-test $(VENV)/.llama-$(LLAMA_BUILD)

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
