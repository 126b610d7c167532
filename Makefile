# outbox-relay developer and CI entry points; `make help` lists them, from the `## ` comment
# on each target's rule.
# The services are this checkout's own (python -m scripts.services; docs/development.md):
# state in .services/, ports 24000-24499 unless SERVICES_PORT_BASE moves them.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LOCK := requirements.lock
RUNTIME_LOCK := requirements-runtime.lock
LOCK_UPGRADE ?=
SERVICES := $(VPY) -m scripts.services
# down needs no driver: it runs without the venv too
SERVICES_DOWN := $(if $(wildcard $(VPY)),$(VPY),"$(PYTHON)") -m scripts.services
ENV_FILE := .services/env
PYTEST_ARGS ?=

.PHONY: help venv lock generate services-up services-down services-status services-env services-purge lint check test demo bench bench-endurance soak release

help: ## this list, from the comment after each target's rule
	@awk -F ':.*## ' '/^[a-z][a-z-]*:.*## / { printf "  %-16s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

venv: $(STAMP) ## .venv exactly as requirements.lock says, plus the package installed editable

# The venv holds what the lock says and nothing else: the lock is installed (hashes checked),
# pip-sync (from the lock) removes whatever it does not list, then the package itself goes
# in without resolving anything. Re-run when the lock or pyproject.toml changed.
$(STAMP): pyproject.toml $(LOCK)
	@if [ ! -x $(VPY) ]; then echo "creating $(VENV)"; "$(PYTHON)" -m venv $(VENV); fi
	$(VPY) -m pip install --quiet --require-hashes --no-deps -r $(LOCK)
	$(VENV)/bin/pip-sync --quiet $(LOCK)
	$(VPY) -m pip install --quiet --no-deps --no-build-isolation -e .
	@touch $@

# Refreshed on purpose, never as a side effect: the whole dependency set (runtime, build
# backend and every extra) with hashes, then the runtime part the image installs (the
# dependencies and the otlp extra: run exports spans when OTEL_* asks), pinned to the same
# versions. LOCK_UPGRADE=1 moves every pin to the newest version pyproject.toml allows;
# without it only what pyproject.toml changed moves. A machine's wheel folder (pip's
# find-links) is not written into the locks.
PIP_COMPILE = $(VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe --strip-extras \
	--all-build-deps --no-emit-index-url --no-emit-find-links $(if $(LOCK_UPGRADE),--upgrade)
lock: venv ## re-resolve requirements.lock and requirements-runtime.lock (LOCK_UPGRADE=1: newest allowed)
	$(PIP_COMPILE) --extra test --extra lint --extra bench --extra otel --extra otlp --output-file $(LOCK) pyproject.toml
	$(PIP_COMPILE) --extra otlp --constraint $(LOCK) --output-file $(RUNTIME_LOCK) pyproject.toml

# deploy/'s PrometheusRule and dashboard ConfigMap from docs/monitoring, the scoring events'
# JSON Schemas from the contract (scripts/generate.py); tests/unit/test_generated.py fails
# while one is stale.
generate: venv ## write the files made from a source: deploy/'s rules and dashboard, docs/schemas
	$(VPY) -m scripts.generate

services-up: venv ## real PostgreSQL 15 (Debian) and 18, Kafka (KRaft), PgBouncer (transaction pooling)
	$(SERVICES) up

services-down: ## stop this checkout's services
	$(SERVICES_DOWN) down

services-status: venv ## what runs, on which ports
	$(SERVICES) status

services-env: ## print the variables that point tests and tools at the services
	@$(SERVICES_DOWN) env

# Stops the services and removes all their state (data, logs, jars), in the checkout and
# under the postgres user's home: before deleting a clone, or to start from nothing.
services-purge: ## stop the services and remove all their state
	$(SERVICES_DOWN) purge

lint: venv ## ruff, ruff format, mypy --strict, the import contracts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

# What to run before each commit, with no service running: lint, then every test the
# `services` marker leaves out (the service fixtures set it: tests/support/services.py),
# in pytest processes side by side (tests/support/check.py).
check: lint ## lint and every test that needs no service: the run before each commit
	$(VPY) -m tests.support.check $(PYTEST_ARGS)

# Lint first (cheap), then services, then pytest. The trap stops exactly the services that
# this run's `up` started (services already running beforehand are left alone), also when
# `up` itself fails half way, and the recipe exits with pytest's own code; 5 ("no tests
# collected") is reported as a failure.
test: venv lint ## lint, the services, every test; stops the services it started (PYTEST_ARGS='-k name -x')
	@started=""; \
	cleanup() { if [ -n "$$started" ]; then echo "services: stopping what this run started:" $$started >&2; $(SERVICES) down $$started || true; fi; }; \
	trap cleanup EXIT; \
	$(SERVICES) up || { rc=$$?; started="$$(cat .services/started-by-last-up 2>/dev/null || true)"; exit "$$rc"; }; \
	started="$$(cat .services/started-by-last-up 2>/dev/null || true)"; \
	set -a; . ./$(ENV_FILE); set +a; \
	export OUTBOX_RELAY_REQUIRE_SERVICES=1; \
	for tool in chromium promtool node-packages; do \
		bash scripts/tools.sh ensure "$$tool" || echo "$$tool is missing: the tests that use it will fail" >&2; \
	done; \
	rc=0; $(VPY) -m pytest --durations=25 $(PYTEST_ARGS) || rc=$$?; \
	if [ "$$rc" -eq 5 ]; then echo "pytest collected no tests (exit 5): treated as failure" >&2; fi; \
	exit "$$rc"

# The demo runs in its own database (outbox_relay_demo): a steady workload and three
# failure stories in turn, until Ctrl-C; DEMO_ARGS passes more flags, e.g.
# DEMO_ARGS='--story-hold-ms 60000' or DEMO_ARGS='--exit-when-done' (stories once, then stop).
DEMO_ARGS ?=
demo: services-up ## the whole system and three failure stories, until Ctrl-C (DEMO_ARGS)
	@set -a; . ./$(ENV_FILE); set +a; \
	demo_url="$$($(VPY) scripts/demo_database.py)"; \
	$(VENV)/bin/outbox-relay migrate --database-url "$$demo_url"; \
	$(VENV)/bin/outbox-relay demo --database-url "$$demo_url" \
		--policy docs/policy.demo.toml --log-format text $(DEMO_ARGS)

# Every benchmark in bench/, including the peer comparison (bench/test_peers.py: the relay vs
# Debezium on Kafka Connect vs the raw aiokafka producer, raw figures kept in
# docs/bench/results.json), then PASS/FAIL per performance target and the plot
# (bench/report/, docs/benchmarks.md). BENCH_EVENTS, BENCH_RUNS, BENCH_SECONDS and
# BENCH_SYSTEMS scale it down. Exits with pytest's code when a benchmark failed, else 1 when
# a target FAILs (on a two-core machine, drain >= 4 x Debezium does), else 0.
bench: services-up ## benchmarks and the peer comparison with Debezium, PASS/FAIL per target
	@set -a; . ./$(ENV_FILE); set +a; \
	rc=0; $(VPY) -m pytest -m bench -p no:cacheprovider bench/ -s $(PYTEST_ARGS) || rc=$$?; \
	if [ "$$rc" -ne 0 ]; then echo "benchmarks failed (pytest exit $$rc); the report below is the last complete one" >&2; fi; \
	report=0; $(VPY) -m bench.report || report=$$?; \
	if [ "$$report" -ne 0 ]; then echo "bench.report exit $$report: a target FAILs (or no figures)" >&2; fi; \
	if [ "$$rc" -eq 0 ]; then rc=$$report; fi; \
	exit "$$rc"

# The relay as deployed for ENDURANCE_MINUTES (default 30) at ENDURANCE_RATE events/s (1000;
# `auto`: 0.8 x the writers' highest sustained rate, measured first, at most 1,000), a backlog
# burst every ten minutes (the relay stopped for a minute), receipts pruned throughout; then
# every event checked on the topic (bench/endurance.py). Writes docs/bench/endurance.jsonl,
# then docs/bench/endurance.md and its plot with the verdict (bench/endurance_report.py).
# Exits 1 when an event was lost or reordered or the verdict FAILs, 3 when the run did not
# complete (the figures of the last complete run are left alone). Not part of make bench.
ENDURANCE_MINUTES ?= 30
ENDURANCE_RATE ?= 1000
ENDURANCE_ARGS ?=
bench-endurance: services-up ## the relay for 30 minutes at a steady rate with backlog bursts, then its verdict
	@set -a; . ./$(ENV_FILE); set +a; \
	rc=0; $(VPY) -m bench.endurance --minutes $(ENDURANCE_MINUTES) --rate $(ENDURANCE_RATE) $(ENDURANCE_ARGS) || rc=$$?; \
	if [ "$$rc" -gt 1 ]; then exit "$$rc"; fi; \
	report=0; $(VPY) -m bench.endurance_report || report=$$?; \
	if [ "$$rc" -eq 0 ]; then rc=$$report; fi; \
	exit "$$rc"

# The system under a seeded fault schedule on services of its own (loopback ports 25000-25999,
# started and stopped by the run; the shared services are not touched), then the audit.
# Writes docs/soak.md and docs/soak.png; exits 1 when anything was lost, reordered, health
# broke an expectation, or the run proved too little (a fault failed to apply, fewer events
# or jobs than the rates promise). SOAK_SECONDS (default 600), SOAK_SEED to repeat a schedule.
SOAK_SECONDS ?= 600
SOAK_SEED ?=
soak: venv ## the system under a seeded fault schedule on services of its own, then the audit
	$(VPY) -m tests.soak.run --seconds $(SOAK_SECONDS) $(if $(SOAK_SEED),--seed $(SOAK_SEED)) --report docs

# Cuts release VERSION (docs/development.md, "Releases"): checks that it can be cut and writes
# the version into every copy and the CHANGELOG's section for it (uncommitted), runs the
# upgrade test from the previous release (release/previous.toml) and the rollout test with
# make test (services included), then commits, tags vVERSION and records it as the previous
# release. Nothing is pushed. A failed test leaves the prepared changes in the tree.
VERSION ?=
RELEASE_TESTS := tests/upgrade tests/deploy/test_rollout.py
release: venv ## cut release VERSION=X.Y.Z: write it, run the upgrade test, commit and tag (no push)
	@if [ -z "$(VERSION)" ]; then echo "make release: VERSION=X.Y.Z is required" >&2; exit 2; fi
	$(VPY) -m scripts.release prepare $(VERSION)
	@$(MAKE) --no-print-directory test PYTEST_ARGS='$(RELEASE_TESTS)' || { \
		echo "make release: the upgrade test failed; nothing was committed or tagged (git checkout -- . undoes the prepared changes)" >&2; exit 1; }
	$(VPY) -m scripts.release tag $(VERSION)
