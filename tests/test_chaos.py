"""Chaos: kill -9, broker restart and a zombie, and still exactly once.

The short run is part of the default suite; ``--run-slow`` adds the long one.
"""

from __future__ import annotations

import uuid

import pytest

from txn.localbroker import create_namespace, enable_namespace_dedup

from chaos import run_chaos, run_outbox_chaos


def _check(res):
    assert res.sent > 0
    assert res.lost == 0, res.summary()
    assert res.duplicated == 0, res.summary()
    assert res.distinct == res.sent, res.summary()
    assert res.out == res.sent, res.summary()
    # The ledger's COMMITTED records account for every output and every input, once.
    assert res.committed_outputs == res.out, res.summary()
    assert res.committed_inputs == res.sent, res.summary()
    assert res.inputs_committed_twice == 0, res.summary()


@pytest.mark.timeout(900)
def test_chaos_short(restartable_broker, tmp_path):
    res = run_chaos(restartable_broker, tmp_path / "chaos", n=2500, rate=150, kills=4, broker_restarts=1, zombies=1,
                    time_limit_s=420)
    assert (res.kills, res.broker_restarts, res.zombies) == (4, 1, 1)
    _check(res)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_chaos_long(restartable_broker, tmp_path):
    res = run_chaos(restartable_broker, tmp_path / "chaos-long", n=30000, rate=400, kills=25, broker_restarts=3,
                    zombies=3, seed=11, time_limit_s=2400)
    assert (res.kills, res.broker_restarts, res.zombies) == (25, 3, 3)
    _check(res)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_outbox_chaos_long(broker, tmp_path):
    ns = f"public/outbox-chaos-{uuid.uuid4().hex[:8]}"
    create_namespace(broker.admin_url, ns)
    enable_namespace_dedup(broker.admin_url, ns)
    res = run_outbox_chaos(broker, f"persistent://{ns}/out", tmp_path / "outbox.db", n=20000,
                           kill_after=[700, 1500, 90, 2600, 333, 1200, 50, 1800, 900, 2200], time_limit_s=1200)
    assert (res.kills, res.lost, res.duplicated, res.out) == (10, 0, 0, 20000), res.summary()
    assert res.in_order
