# headwater: the two commands a newcomer needs are `make demo` and `make test`.
# Both install what is missing first (Python packages, JVM artifacts, redis-server, chromium) and start
# the services they use, then stop only what they started.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HW := $(VENV)/bin/headwater
SHELL := /bin/bash

.DEFAULT_GOAL := help
.PHONY: FORCE help setup docs grpc-code redis-server chromium services-up services-down cluster-up cluster-down test-cluster demo test test-unit lint check bench wheel clean

help:  ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup: $(VENV)/.installed infra/lib/.resolved redis-server chromium grpc-code  ## Install everything (idempotent)

# Python packages: one venv, the project installed editable with its dev tools, in setuptools' strict
# editable mode: build/__editable__.* holds a tree of links (headwater/registry/... -> registry/...)
# that mypy, pyright and import-linter follow like any installed package. A module added or removed
# is linked at the next `make setup` (the list of code files is a prerequisite).
CODE_FOLDERS := registry pipelines ranking serving client cli
CODE_FILES := $(shell find $(CODE_FOLDERS) -name "*.py" -not -name "*_pb2*" 2>/dev/null | sort)
$(VENV)/.installed: pyproject.toml setup.py $(VENV)/.code-files
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e ".[dev]" --config-settings editable_mode=strict
	@rm -f $(GRPC_CODE)  # generated again below, then linked into the editable tree
	@touch $@

# Rewritten only when the set of code files changes, so adding a module re-links the editable install.
$(VENV)/.code-files: FORCE
	@mkdir -p $(VENV)
	@echo "$(CODE_FILES)" | cmp -s - $@ || echo "$(CODE_FILES)" > $@
FORCE:

# The gRPC code of the ranking service, generated from client/proto (git-ignored; the wheel ships it).
PROTOS := $(shell find client/proto -name "*.proto")
GRPC_CODE := $(PROTOS:.proto=_pb2.py)
grpc-code: $(GRPC_CODE)
# The strict editable install links files, not folders: the generated modules are linked by
# installing once more (no dependencies, a few seconds).
$(GRPC_CODE): %_pb2.py: %.proto client/proto/generate.py $(VENV)/.installed
	$(PY) client/proto/generate.py
	$(PY) -m pip install -q --no-deps --no-build-isolation -e . --config-settings editable_mode=strict

# JVM artifacts: resolved once by Maven into infra/lib/ (git-ignored); nothing downloads at run time.
infra/lib/.resolved: infra/pom.xml $(wildcard infra/maven/*/pom.xml) $(shell find infra/maven -name "*.java" -not -path "*/target/*")
	mvn -q -B -f infra/pom.xml package
	@touch $@

redis-server:
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server (Debian)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq redis-server >/dev/null; }

# A real headless browser for the test of the HTML freshness report (the test skips without one).
chromium:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || { \
	  echo "installing chromium + chromium-driver (Debian)"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; }

services-up: setup  ## Start Redis and Kafka on loopback and create the topics
	bash infra/services.sh up

services-down:  ## Stop the services that headwater started
	bash infra/services.sh down

# The cluster profile (issue 19), on loopback (infra/cluster.sh): Redis Cluster (7000-7005), a 3-broker
# KRaft Kafka (19092-19094), a Flink session cluster (REST 8281, 2 TaskManagers) and Spark standalone
# (spark://127.0.0.1:7077, 1 worker). Point the tiers at it with HEADWATER_REDIS_URL=redis-cluster://
# 127.0.0.1:7000, HEADWATER_KAFKA_BOOTSTRAP=127.0.0.1:19092,..., --jobmanager and --master.
cluster-up: setup  ## Start the cluster profile (Redis Cluster, Kafka x3, Flink, Spark) on loopback
	bash infra/cluster.sh up

cluster-down:  ## Stop the cluster profile's processes that headwater started
	bash infra/cluster.sh down

test-cluster: setup  ## The failure tests on the cluster profile (needs make cluster-up)
	$(PY) -m pytest -m cluster tests/integration/cluster

demo: setup  ## The end-to-end demo on the local default
	bash infra/with-services.sh bash infra/demo.sh

lint: setup  ## ruff, formatting, mypy, the import contracts (the layers of DESIGN.md) and the docs build
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy $(foreach d,$(CODE_FOLDERS),-p headwater.$(d))
	$(VENV)/bin/lint-imports
	$(MAKE) --no-print-directory docs

# The docs site (docs/, mkdocs.yml): concepts, tutorials, operations, benchmarks, and the reference
# generated at build time from the code (CLI, YAML models, OpenAPI, proto). --strict: a broken link
# or a warning fails the build, and so `make lint`.
docs: setup  ## Build the docs site strictly into build/site
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -q -d build/site

check: setup  ## The registry gate CI runs: validate features/ against SLAs and the budget
	$(HW) check features/

test: lint check  ## The whole suite: lint, the registry gate, unit and integration tests
	bash infra/with-services.sh $(PY) -m pytest tests

test-unit: setup  ## Unit tests only (no services)
	$(PY) -m pytest tests/unit

bench: setup  ## Every benchmark; figures printed and written to bench/results/
	bash infra/with-services.sh bash bench/run_all.sh

# The wheel a user installs (`pip install dist/headwater-*.whl`): the code, the example feature repo
# (`headwater init`) and the Maven project of the jars (`headwater setup jars`). build/lib is removed
# first: setuptools reuses it, and a module deleted since the last build would ship again.
wheel: setup  ## Build the installable wheel into dist/
	rm -rf build/lib build/bdist.*
	$(PY) -m pip wheel -q --no-deps --no-build-isolation -w dist .
	@ls -1 dist/headwater-*.whl

clean:  ## Remove build output and local service state (stop services first)
	rm -rf build infra/state .headwater .pytest_cache .mypy_cache .ruff_cache
