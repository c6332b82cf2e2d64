# headwater: the two commands a newcomer needs are `make demo` and `make test`.
# Both install what is missing first (Python packages, JVM artifacts, redis-server, chromium) and start
# the services they use, then stop only what they started.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
HW := $(VENV)/bin/headwater
SHELL := /bin/bash

.DEFAULT_GOAL := help
.PHONY: help setup grpc-code redis-server chromium services-up services-down cluster-up cluster-down test-cluster demo test test-unit lint check bench wheel clean

help:  ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}'

setup: $(VENV)/.installed infra/lib/.resolved redis-server chromium build/typing grpc-code  ## Install everything (idempotent)

# Python packages: one venv, the project installed editable with its dev tools.
$(VENV)/.installed: pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e ".[dev]"
	@touch $@

# The gRPC code of the ranking service, generated from serving/proto (git-ignored; the wheel ships it).
PROTOS := $(shell find serving/proto -name "*.proto")
GRPC_CODE := $(PROTOS:.proto=_pb2.py)
grpc-code: $(GRPC_CODE)
$(GRPC_CODE): %_pb2.py: %.proto serving/proto/generate.py $(VENV)/.installed
	$(PY) serving/proto/generate.py

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

# mypy cannot follow the editable install's import hook, so it reads the code through a
# tree of links that spells the package names (headwater.registry -> registry/, ...).
build/typing:
	@mkdir -p build/typing/headwater
	@for d in registry pipelines serving client; do ln -sfn ../../../$$d build/typing/headwater/$$d; done

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

lint: setup  ## ruff, formatting and mypy
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	MYPYPATH=build/typing $(VENV)/bin/mypy -p headwater.registry -p headwater.pipelines -p headwater.serving -p headwater.client

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
