# The one task runner, for people and CI alike. `make help` lists the targets.
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Point at the devstack unless the caller already points at other services.
USE_ENV := if [ -z "$${MATCHER_KAFKA_BOOTSTRAP_SERVERS:-}" ] || [ -z "$${MATCHER_DATABASE_URL:-}" ]; then \
	$(BIN)/matcher devstack up && eval "$$($(BIN)/matcher devstack env)"; fi

.PHONY: help install ts-install lock reference up down status migrate run lint test test-quick test-fast test-tools chart-check docs docs-build campaign bench bench-quick screenshots schemas schema-sql clean

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# Every group of pyproject.toml's (test, lint, browser, bench, docs), the producer SDK and
# the development-only devstack, at the versions constraints.txt pins (`make lock`).
$(STAMP): pyproject.toml producers/python/pyproject.toml devstack/pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "matcher needs Python 3.11 or newer (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt \
	  -e producers/python -e devstack -e '.[dev]'
	touch $@

install: $(STAMP) ## Create the virtualenv: matcher, the devstack, every tool, pinned.

up: install ## Start the local Kafka and Postgres (idempotent).
	$(BIN)/matcher devstack up

down: install ## Stop the local Kafka and Postgres (data kept).
	$(BIN)/matcher devstack down

status: install ## Show the local stack.
	$(BIN)/matcher devstack status

migrate: install ## Apply migrations and create topics (on the devstack unless MATCHER_* say otherwise).
	$(USE_ENV); $(BIN)/matcher migrate

run: install ## Run the daemon in the foreground on the local stack; Ctrl-C stops it.
	$(USE_ENV); $(BIN)/matcher migrate && \
	if [ -z "$${MATCHER_PRODUCERS_FILE:-}" ]; then export MATCHER_ALLOW_UNSIGNED=$${MATCHER_ALLOW_UNSIGNED:-true}; fi && \
	exec $(BIN)/matcher run

# The TypeScript SDK's dependencies and tools, exactly as its lock file pins them.
TS_SDK := sdks/typescript
TS_INSTALLED := $(TS_SDK)/node_modules/.package-lock.json
$(TS_INSTALLED): $(TS_SDK)/package.json $(TS_SDK)/package-lock.json
	@command -v npm >/dev/null || { echo "the TypeScript SDK needs Node.js 20+ and npm (see the README)" >&2; exit 1; }
	cd $(TS_SDK) && timeout 600 npm ci --no-audit --no-fund --loglevel=error
	touch $@

ts-install: $(TS_INSTALLED) ## Install the TypeScript SDK's pinned dependencies (npm ci).

lint: install $(TS_INSTALLED) ## Lint, format check, strict type check, import contracts; tsc and eslint for the TypeScript SDK.
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy matcher tests producers/python devstack/matcher_devstack examples bench
	$(BIN)/lint-imports
	cd $(TS_SDK) && npm run --silent lint

# The pins every install uses (make install, CI): what `make test` passed with. `make lock`
# renews them to the newest versions pyproject.toml's groups allow; run `make test`, and
# commit constraints.txt with the change that needed it.
LOCK_INPUT := -e ./producers/python\n-e ./devstack\n-e .[dev]\n
lock: install ## Renew constraints.txt to the newest allowed versions (then run make test and commit it).
	$(BIN)/python -m pip install --quiet 'uv>=0.5'
	printf -- '$(LOCK_INPUT)' > $(VENV)/lock.in
	$(BIN)/python -m uv pip compile --quiet --upgrade --python-version 3.11 --no-header \
	  --no-annotate $(VENV)/lock.in -o $(VENV)/lock.out
	{ echo '# Pinned by `make lock` (see the Makefile); installed with -c by `make install`.'; \
	  grep -v '^-e' $(VENV)/lock.out; } > constraints.txt
	rm -f $(STAMP)

docs: install reference ## Serve the documentation site on http://127.0.0.1:8000 (reloads on edits).
	$(BIN)/mkdocs serve

docs-build: install ## Build the documentation site into site/: warnings (a broken link or anchor) are errors.
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

reference: install ## Regenerate docs/reference/cli.md and configuration.md from the code (a test fails when they drift).
	$(BIN)/python -m matcher.reference docs/reference

chart-check: ## Lint and render the Helm chart; check bad values are refused (builds helm once; needs Go).
	scripts/check-chart

# promtool is built and Chromium and kcat installed (once) before pytest, so that their
# progress shows.
test: lint docs-build chart-check ## Lint, build the docs, check the chart, then every test against real Kafka and Postgres.
	scripts/install-promtool >/dev/null
	scripts/install-chromium >/dev/null
	scripts/install-kcat >/dev/null
	$(USE_ENV); $(BIN)/pytest

# The long campaign: the gate fuzzed with FUZZ_INPUTS inputs (and coverage-guided with
# atheris), every crash point CRASH_ITERATIONS times under load, the fault tests
# FAULT_ROUNDS times, the races and the stateful test with far more examples, the property
# test at length, the replay window after a 10-minute outage (tolerance 5 minutes), and
# the cluster failover test CLUSTER_ROUNDS times.
CRASH_ITERATIONS ?= 50
FAULT_ROUNDS ?= 10
WORKER_CRASHES ?= 30
FUZZ_INPUTS ?= 1000000
# Rounds of the cluster failover test (each: four faults under load), and where their
# measurements go (JSON lines).
CLUSTER_ROUNDS ?= 10
CLUSTER_REPORT ?= cluster-failover.jsonl
campaign: install ## Long fuzz/crash/fault/race campaign (an hour or more; not part of `make test`).
	$(BIN)/python -m tests.fuzzing.campaign --inputs $(FUZZ_INPUTS)
	$(BIN)/python -m pip install --quiet atheris && \
	  $(BIN)/python -m tests.fuzzing.campaign --engine atheris --inputs $$(( $(FUZZ_INPUTS) / 5 ))
	MATCHER_TEST_PROPERTY_EXAMPLES=50000 MATCHER_TEST_FUZZ_EXAMPLES=50000 \
	  $(BIN)/pytest -q tests/unit/test_gate_properties.py tests/unit/test_fuzz_gate.py
	$(USE_ENV); \
	MATCHER_TEST_OUTAGE_S=600 MATCHER_TEST_TOLERANCE_S=300 \
	  $(BIN)/pytest -q tests/integration/test_adversary.py -k daemon_was_down && \
	MATCHER_TEST_CRASH_ITERATIONS=$(CRASH_ITERATIONS) $(BIN)/pytest -q tests/integration/test_crash.py && \
	MATCHER_TEST_WORKER_CRASHES=$(WORKER_CRASHES) $(BIN)/pytest -q tests/integration/test_worker_crash.py && \
	MATCHER_TEST_TS_WORKER_CRASHES=$(WORKER_CRASHES) MATCHER_TEST_TS_WORKER_RESUMES=1000 \
	  $(BIN)/pytest -q tests/integration/test_typescript_sdk.py -k killed && \
	MATCHER_TEST_LANGGRAPH_CRASHES=10 MATCHER_TEST_LANGGRAPH_THREADS=200 \
	  $(BIN)/pytest -q tests/integration/test_langgraph_crash.py && \
	MATCHER_TEST_RACE_ROUNDS=300 MATCHER_TEST_PAIRS=5000 $(BIN)/pytest -q tests/integration/test_concurrency.py && \
	MATCHER_TEST_STATEFUL_EXAMPLES=1000 $(BIN)/pytest -q tests/integration/test_stateful.py && \
	for round in $$(seq $(FAULT_ROUNDS)); do \
	  echo "fault round $$round"; \
	  $(BIN)/pytest -q tests/integration/test_faults.py tests/integration/test_outage.py || exit 1; \
	done
	MATCHER_TEST_CLUSTER_ROUNDS=$(CLUSTER_ROUNDS) MATCHER_TEST_CLUSTER_REPORT=$(CLUSTER_REPORT) \
	  $(BIN)/pytest -q -s tests/cluster/test_failover.py

# The Restate peer's server comes from npm (once, cached); without it the peer's figures
# are null and the results' notes say why.
bench: install ## The full benchmark (35-60 minutes by the hour, with 10M stored rows); the last line is the results JSON.
	scripts/install-restate >/dev/null || echo "bench: no restate-server, the Restate peer will be null" >&2
	$(USE_ENV); $(BIN)/python -m bench.run

bench-quick: install ## The benchmark in about 5 minutes with the peers (fewer events, smaller scale).
	scripts/install-restate >/dev/null || echo "bench: no restate-server, the Restate peer will be null" >&2
	$(USE_ENV); $(BIN)/python -m bench.run --quick

screenshots: install ## Remake the docs' console screenshots (docs/operations/console/*.png) with the browser tests.
	scripts/install-chromium >/dev/null
	$(USE_ENV); MATCHER_TEST_SCREENSHOTS_DIR=docs/operations/console $(BIN)/pytest -q tests/browser -k accessibility

schemas: install ## Regenerate schemas/ from the pydantic models (a test fails when they drift).
	$(BIN)/python -m matcher.wire_schemas schemas

schema-sql: install ## Rewrite matcher/store/schema.sql from the migrations (a test fails when it drifts).
	$(USE_ENV); $(BIN)/python -m matcher.store.schema_file

test-quick: install ## The unit tests (fewer generated examples) and an integration smoke, in under 3 minutes.
	$(USE_ENV); MATCHER_TEST_PROPERTY_EXAMPLES=300 MATCHER_TEST_FUZZ_EXAMPLES=600 \
	  $(BIN)/pytest -m "unit or smoke" -q

test-fast: install ## Only the unit tests (no services, no helm or promtool).
	$(BIN)/pytest -m unit -q

test-tools: install ## The tests that run helm and promtool (no services; builds both once; needs Go).
	scripts/install-helm >/dev/null
	scripts/install-promtool >/dev/null
	$(BIN)/pytest tests/tools

clean: ## Remove the virtualenv and caches (the devstack's data stays; see `matcher devstack up --fresh`).
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis site $(TS_SDK)/node_modules $(TS_SDK)/dist
