# The two set-up commands of the README. Both install what they need first.
.PHONY: setup demo test test-all lint bench

setup:
	@bash deploy/bootstrap.sh

demo: setup            ## the full demo: broker, control plane, Spark job with a fault and a poison, replay
	.venv/bin/pulsar-txn demo

test: setup            ## the whole default test suite (starts its own broker)
	.venv/bin/python -m pytest -q --durations=60

test-all: setup        ## plus the long soak/chaos runs
	.venv/bin/python -m pytest -q --run-slow

lint: setup
	.venv/bin/ruff check .

bench: setup
	.venv/bin/python bench/bench_client.py
