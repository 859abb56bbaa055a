# From a fresh clone: `make test` installs everything (Debian and Python packages) and runs the tests.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=
# pytest-xdist workers (many tests wait on I/O: servers, masters, child processes). loadfile keeps
# a module on one worker, so module fixtures and file-order tests hold; PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= 2

.PHONY: install system-deps sglang-0.5.14 sglang-releases lint test test-deep serve bench-keys gpu-check clean

# Mooncake's wheel links against libibverbs; the native page-hash loop builds against OpenSSL;
# promtool (Debian's prometheus) checks alerts/ and the dashboard's queries.
system-deps:
	@missing=""; \
	ldconfig -p | grep -q 'libibverbs.so.1 ' || missing="$$missing libibverbs1"; \
	[ -f /usr/include/openssl/sha.h ] || missing="$$missing libssl-dev"; \
	command -v gcc >/dev/null || missing="$$missing gcc"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && $(SUDO) DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

$(STAMP): pyproject.toml setup.py | system-deps
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	touch $(STAMP)

install: system-deps $(STAMP)

# SGLang 0.5.14's own code for the cross-checks, beside the installed 0.5.23: both are the
# package `sglang`, so the tests import it from this folder in child processes
# (tests/sglang_0_5_14.py). A wheel of a few MB, unpacked once.
SGLANG_OLD_DIR := .cache/sglang-0.5.14
$(SGLANG_OLD_DIR)/.unpacked: | $(STAMP)
	rm -rf $(SGLANG_OLD_DIR) .cache/wheels/sglang-0.5.14-*.whl && mkdir -p .cache/wheels $(SGLANG_OLD_DIR)
	$(PIP) download -q --no-deps sglang==0.5.14 -d .cache/wheels
	$(PY) -m zipfile -e .cache/wheels/sglang-0.5.14-*.whl $(SGLANG_OLD_DIR)
	touch $@

sglang-0.5.14: $(SGLANG_OLD_DIR)/.unpacked

# Every release between 0.5.14 and the installed 0.5.23 (post releases included), each unpacked
# under .cache/sglang-X for the per-release cross-checks (tests/sglang_release.py,
# tests/sglang/test_releases.py). A download that fails fails the target: the tests never skip.
SGLANG_RELEASES := 0.5.15 0.5.15.post1 0.5.16 0.5.17 0.5.18 0.5.19 0.5.20 0.5.21 0.5.22
RELEASE_STAMPS := $(foreach v,$(SGLANG_RELEASES),.cache/sglang-$(v)/.unpacked)
.cache/sglang-%/.unpacked: | $(STAMP)
	rm -rf .cache/sglang-$* && mkdir -p .cache/wheels .cache/sglang-$*
	$(PIP) download -q --no-deps sglang==$* -d .cache/wheels
	$(PY) -m zipfile -e $$(ls .cache/wheels/sglang-$*-*.whl | head -1) .cache/sglang-$*
	touch $@

sglang-releases: $(SGLANG_OLD_DIR)/.unpacked $(RELEASE_STAMPS)

# ruff (lint + format check) and mypy, configured in pyproject.toml; `make test` runs it first.
lint: install
	VENV=$(VENV) scripts/lint.sh

# Everything the tests write (pytest's folders, every TMPDIR user, the libraries SGLang imports)
# stays under .cache/pytest, emptied at the start of each run: nothing is left in /tmp.
TEST_TMP := $(CURDIR)/.cache/pytest
test: install sglang-0.5.14 sglang-releases lint
	rm -rf $(TEST_TMP) && mkdir -p $(TEST_TMP)/tmp
	TMPDIR=$(TEST_TMP)/tmp $(VENV)/bin/pytest --basetemp=$(TEST_TMP)/run -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The engine's property tests with fresh, many more hypothesis examples (profile "deep" in
# tests/conftest.py; `make test` runs the fixed "ci" draw); the oracle (tests/engine/test_oracle.py,
# docs/oracle.md) replays 1,000 fresh workloads per family through both SGLang versions.
test-deep: install sglang-0.5.14
	rm -rf $(TEST_TMP) && mkdir -p $(TEST_TMP)/tmp
	HYPOTHESIS_PROFILE=deep TMPDIR=$(TEST_TMP)/tmp $(VENV)/bin/pytest --basetemp=$(TEST_TMP)/run $(PYTEST_ARGS) tests/engine

# The main job: the embedded tiered cache (L1/L2/L3 with a Mooncake master) on 127.0.0.1:18080.
SERVE_ARGS ?=
serve: install
	$(VENV)/bin/hicache serve $(SERVE_ARGS)

# Page-key throughput against SGLang's own get_hash_str, measured side by side.
bench-keys: install
	$(VENV)/bin/hicache bench keys

# On a CUDA host: Triton kernels against SGLang's layouts, bench kernels on the GPU and a short
# serve --device cuda session, one JSON summary in gpu-check.json. Without CUDA: says so, exits 0.
gpu-check: install
	$(PY) scripts/gpu_check.py --out gpu-check.json

clean:
	rm -rf $(VENV) .cache build *.egg-info src/hicache_ops/sglang/*.so
