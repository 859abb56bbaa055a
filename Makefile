# From a fresh clone: `make test` installs everything (Debian and Python packages) and runs the tests.
# pytest runs as .venv/bin/pytest, not `python -m pytest`: the latter puts the checkout on sys.path,
# where the top-level kernels/ folder would shadow the PyPI package `kernels` that SGLang imports.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: install system-deps test serve bench-keys clean

# Mooncake's wheel links against libibverbs; the native page-hash loop builds against OpenSSL.
system-deps:
	@missing=""; \
	ldconfig -p | grep -q 'libibverbs.so.1 ' || missing="$$missing libibverbs1"; \
	[ -f /usr/include/openssl/sha.h ] || missing="$$missing libssl-dev"; \
	command -v gcc >/dev/null || missing="$$missing gcc"; \
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

test: install
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# The main job: the embedded tiered cache (L1/L2/L3 with a Mooncake master) on 127.0.0.1:18080.
SERVE_ARGS ?=
serve: install
	$(VENV)/bin/hicache serve $(SERVE_ARGS)

# Page-key throughput against SGLang's own get_hash_str, measured side by side.
bench-keys: install
	$(VENV)/bin/hicache bench keys

clean:
	rm -rf $(VENV) build *.egg-info hicache_ops/sglang/*.so
