# The two set-up commands of the README. Both install what they need first.
.PHONY: setup demo test test-all lint bench

setup:
	@bash deploy/bootstrap.sh

demo: setup            ## the full demo: broker, control plane, Spark job with a fault and a poison, replay
	.venv/bin/pulsar-txn demo

# Test files run on this many workers (pytest-xdist), each starting its own broker when it needs one.
TEST_WORKERS ?= 2

test: setup            ## the whole default test suite (starts its own brokers)
	.venv/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=60

test-all: setup        ## plus the long soak/chaos runs
	.venv/bin/python -m pytest -q --run-slow

lint: setup
	.venv/bin/ruff check .

bench: setup
	.venv/bin/python bench/bench_client.py
