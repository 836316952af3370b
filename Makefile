# The two set-up commands of the README. Both install what they need first.
.PHONY: setup demo test test-all lint bench

setup:
	@bash deploy/bootstrap.sh

demo: setup            ## the full demo: broker, control plane, Spark job with a fault and a poison, replay
	.venv/bin/pulsar-txn demo

# Test files run on this many workers (pytest-xdist), each starting its own broker when it needs
# one; then the files marked `solo` (chaos, clusters, the demo) run alone, so they never share the
# machine. Both parts always run; the target fails if either did.
TEST_WORKERS ?= 2

test: setup            ## the whole default test suite (starts its own brokers)
	@rc=0; \
	.venv/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not solo" --durations=40 || rc=$$?; \
	.venv/bin/python -m pytest -q -m solo --durations=20 || rc=$$((rc ? rc : $$?)); \
	exit $$rc

test-all: setup        ## plus the long soak/chaos runs
	.venv/bin/python -m pytest -q --run-slow

lint: setup
	.venv/bin/ruff check .

bench: setup
	.venv/bin/python bench/bench_client.py
