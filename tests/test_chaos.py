"""Chaos: kill -9, broker restarts (clean and SIGKILL) and a zombie, and still exactly once.

The short runs are part of the default suite (the shape users run: a batched producer, a handler
emitting ``id % 3`` outputs, deduplication off on the outputs; the original unbatched 1:1 run is
slow-only, the loop covers unbatched shapes), and so are the two shapes users broke the processor
with: a zombie paused a few seconds (the broker still counts it as connected) that runs on beside
its replacement for a minute, inside a fleet of 3 instances on a 4-partition input with traffic
during the faults, which must also drain every input by itself (nothing stranded) once the faults
are over (the single-instance zombie run is slow-only). The fleet also runs behind the real Pulsar
Proxy with a broken network between it and the proxy (stalls, resets, a black hole longer than the
keep-alive and the transaction timeout). ``--run-slow`` adds the long runs and the whole shape
matrix. ``tests/chaos_loop.py`` runs the matrix in a loop.
"""

from __future__ import annotations

import uuid

import pytest

from txn.admin import create_namespace, enable_namespace_dedup

from chaos import ALL_SHAPES, Shape, run_chaos, run_outbox_chaos

#: Saturates the machine (or starts brokers of its own): `make test` runs it after the parallel part, alone.
pytestmark = pytest.mark.solo


def _check(res):
    assert res.sent > 0
    assert res.send_failed == 0, res.summary()
    assert not res.timed_out, res.summary()
    assert res.lost == 0, res.summary()
    assert res.duplicated == 0, f"{res.summary()} duplicated: {res.duplicated_ids[:50]}"
    assert res.unexpected == 0, res.summary()
    assert res.distinct == res.expected, res.summary()
    assert res.out == res.expected, res.summary()
    # The ledger's COMMITTED records account for every output and every input, once.
    assert res.committed_outputs == res.out, res.summary()
    assert res.committed_inputs == res.sent, res.summary()
    assert res.inputs_committed_twice == 0, res.summary()


def _check_live(res):
    """Exactly once, and live: the fleet drained every input after the last fault by itself."""
    _check(res)
    assert res.stranded == 0, f"{res.summary()}\n" + "\n".join(res.events[-8:])
    assert res.drain_exits == 0, res.summary()
    assert res.drain_s is not None and res.drain_s <= res.drain_limit_s, res.summary()


#: The shape users run: batched producer, ``id % 3`` outputs, deduplication off on the outputs.
USERS_P4 = Shape(batched=True, partitions=4, handler="mod3", out_dedup=False)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_short(restartable_broker, tmp_path):
    """The original shape (unbatched, one partition, 1:1): 4 kills, a clean broker restart, and a
    zombie paused 5 s that runs on beside its replacement (at least 30 s) to the end."""
    res = run_chaos(restartable_broker, tmp_path / "chaos", n=2500, rate=150, kills=4, broker_restarts=1, zombies=1,
                    zombie_pause_s=5, zombie_linger_s=30, batch_max_messages=50, txn_timeout_ms=8000,
                    drain_limit_s=90, time_limit_s=420)
    assert (res.kills, res.broker_restarts, res.zombies) == (4, 1, 1)
    assert res.expected == res.sent
    _check_live(res)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_chaos_short_batched(restartable_broker, tmp_path):
    """Batched producer (entries of up to 1000 messages), id % 3 outputs, deduplication off on the
    outputs, processor batches of 100, a lagging processor (3000 inputs kept unprocessed, so a
    restart finds it inside an entry): a clean broker restart, kills and a zombie. Slow-only since
    2026-11-26 for the default suite's time: the default fleet run covers batched inputs under
    kills, restarts and a zombie, and the chaos loop covers one partition."""
    shape = Shape(batched=True, partitions=1, handler="mod3", out_dedup=False)
    res = run_chaos(restartable_broker, tmp_path / "chaos", shape=shape, n=150_000, backlog=3000, kills=5,
                    broker_restarts=1, zombies=1, txn_timeout_ms=15000, seed=23, time_limit_s=480)
    assert (res.kills, res.broker_restarts, res.zombies) == (5, 1, 1)
    assert res.max_entry > 100  # the producer really batched
    assert res.expected == sum(i % 3 for i in range(res.sent)) and res.sent == res.produced
    _check(res)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_short_zombie(restartable_broker, tmp_path):
    """A zombie paused 5 s (well under the broker's 30 s keep-alive and the 15 s transaction
    timeout: its connection, its consumer and its open transaction all survive) while a replacement
    starts, then resumed and left running beside the replacement to the end (at least 60 s before
    the drain); two kills of the replacement meanwhile. The processors are kept busy (3000 inputs
    unprocessed, published while the faults go on), so the pause lands in the middle of a batch.
    Nothing twice, nothing stranded. About 2-3 minutes on 2 cores."""
    res = run_chaos(restartable_broker, tmp_path / "chaos", shape=USERS_P4, n=150_000, backlog=3000, kills=2,
                    broker_restarts=0, zombies=1, zombie_pause_s=5, zombie_linger_s=60, fault_gap_s=(5, 10),
                    txn_timeout_ms=15000, seed=41, drain_limit_s=90, time_limit_s=420)
    assert (res.kills, res.zombies, res.instances) == (2, 1, 1)
    assert res.max_entry > 1  # the producer really batched
    _check_live(res)


@pytest.mark.timeout(720)
def test_chaos_fleet(restartable_broker, tmp_path):
    """Three instances of one job on one subscription, a 4-partition input published to during the
    faults (paced by the fleet: about 3000 inputs kept unprocessed, so every instance is in the
    middle of a batch when a fault hits): SIGKILLs of random instances, a clean broker restart, a
    broker SIGKILL, and a zombie paused 5 s (well under the keep-alive and the transaction timeout)
    that runs on beside its replacement to the end (at least 60 s). Exactly once, and after the
    last fault the three drain every input by themselves (the broker does not redeliver what it
    holds for a consumer that stays connected).

    No *clean* broker restart here: Pulsar 4.0.8 can roll a transaction committed a few seconds
    before a clean restart back to open and then abort it (apache/pulsar#20150, open upstream),
    which makes a committed batch vanish in about 1 run in 12; no client can prevent it. The slow
    runs and ``tests/chaos_loop.py`` keep clean restarts and report it (docs/reliability.md,
    section 7). About 3-4 minutes on 2 cores."""
    res = run_chaos(restartable_broker, tmp_path / "chaos", shape=USERS_P4, n=300_000, backlog=3000, kills=6,
                    broker_restarts=0, broker_kills=1, zombies=1, zombie_pause_s=5, zombie_linger_s=60,
                    instances=3, fault_gap_s=(4, 8), txn_timeout_ms=15000, seed=43, drain_limit_s=90,
                    time_limit_s=540)
    assert (res.kills, res.broker_restarts, res.broker_kills, res.zombies, res.instances) == (6, 0, 1, 1, 3)
    _check_live(res)


@pytest.mark.timeout(480)
def test_chaos_network(broker, tmp_path):
    """The fleet of 3 on a 4-partition input reaches the broker through the real Pulsar Proxy, and
    between each instance and the proxy a relay breaks the network: a 6 s stall (sockets open,
    nothing moves), two resets (connections closed with an RST: every instance's, then one
    instance's) and a 35 s black hole on every instance (longer than the 30 s keep-alive interval
    and the 15 s transaction timeout: silence both ways, new connections accepted but silent, then
    every broken connection reset). Live traffic paced by the fleet (about 3000 inputs kept
    unprocessed until the last fault, so the faults land in the middle of batches; the generator
    and the verifier talk to the broker directly). Exactly once, and the fleet drains every input
    by itself after the last fault. About 2-2.5 minutes on 2 cores (with the proxy's start)."""
    res = run_chaos(broker, tmp_path / "chaos", shape=USERS_P4, n=300_000, backlog=3000, kills=0, broker_restarts=0,
                    zombies=0, instances=3, net_stalls=1, net_resets=2, net_blackholes=1, net_stall_s=6,
                    net_blackhole_s=35, net_scope="mixed", fault_gap_s=(3, 5), txn_timeout_ms=15000, seed=59,
                    drain_limit_s=90, time_limit_s=400)
    assert (res.net_stalls, res.net_resets, res.net_blackholes, res.instances) == (1, 2, 1, 3)
    assert res.net_conns_reset > 0 and res.net_dropped_bytes > 0  # the faults really hit the fleet
    _check_live(res)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_chaos_network_long(restartable_broker, tmp_path):
    """The network shape, longer and with more faults: a fleet of 3 through the proxy and the relays,
    on live traffic paced by the fleet: 3 stalls of 10 s, 6 resets, two black holes of 75 s (longer
    than the keep-alive and the transaction timeout), 2 slow spells (256-byte fragments), each kind
    hitting alternately every instance and one of them (one pod cut off while the others go on and
    the broker moves its partitions away), and among them 3 SIGKILLs of instances and a clean broker
    restart (behind the proxy)."""
    res = run_chaos(restartable_broker, tmp_path / "chaos", shape=USERS_P4, n=1_200_000, backlog=3000, kills=3,
                    broker_restarts=1, zombies=0, instances=3, net_stalls=3, net_resets=6, net_blackholes=2,
                    net_slows=2, net_stall_s=10, net_blackhole_s=75, net_slow_s=15, net_scope="mixed",
                    fault_gap_s=(4, 8), txn_timeout_ms=15000, seed=61, drain_limit_s=120, time_limit_s=1800)
    assert (res.kills, res.broker_restarts, res.net_stalls, res.net_resets, res.net_blackholes, res.net_slows) == (
        3, 1, 3, 6, 2, 2)
    _check_live(res)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_chaos_zombie_long(restartable_broker, tmp_path):
    """The zombie shape, longer: a fleet of 2 kept busy (3000 inputs unprocessed), two zombies
    paused 10 s, each running beside its replacement to the end (at least 90 s), 8 kills and a
    clean broker restart meanwhile."""
    res = run_chaos(restartable_broker, tmp_path / "chaos", shape=USERS_P4, n=600_000, backlog=3000, kills=8,
                    broker_restarts=1, zombies=2, zombie_pause_s=10, zombie_linger_s=90, instances=2,
                    fault_gap_s=(5, 10), txn_timeout_ms=15000, seed=47, drain_limit_s=120, time_limit_s=1500)
    assert (res.kills, res.broker_restarts, res.zombies, res.instances) == (8, 1, 2, 2)
    _check_live(res)


@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_chaos_fleet_long(restartable_broker, tmp_path):
    """The fleet shape, longer, on paced live traffic: 20k inputs spread over 12 kills, 2 clean
    broker restarts, a broker SIGKILL and a zombie paused 10 s that runs on beside its replacement
    to the end (at least 60 s)."""
    res = run_chaos(restartable_broker, tmp_path / "chaos", shape=USERS_P4, n=20000, rate=0, kills=12,
                    broker_restarts=2, broker_kills=1, zombies=1, zombie_pause_s=10, zombie_linger_s=60,
                    instances=3, txn_timeout_ms=15000, seed=53, drain_limit_s=120, time_limit_s=2000)
    assert (res.kills, res.broker_restarts, res.broker_kills, res.zombies, res.instances) == (12, 2, 1, 1, 3)
    _check_live(res)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_chaos_long(restartable_broker, tmp_path):
    res = run_chaos(restartable_broker, tmp_path / "chaos-long", n=30000, rate=400, kills=25, broker_restarts=3,
                    zombies=3, seed=11, batch_max_messages=50, txn_timeout_ms=8000, time_limit_s=2400)
    assert (res.kills, res.broker_restarts, res.zombies) == (25, 3, 3)
    _check(res)


@pytest.mark.slow
@pytest.mark.timeout(2700)
@pytest.mark.parametrize("shape", ALL_SHAPES, ids=lambda s: s.name)
def test_chaos_shape(restartable_broker, tmp_path, shape):
    """Every shape: 20k inputs, 20 kills, 2 clean broker restarts, 1 SIGKILL of the broker, a zombie,
    the processor's defaults (batches of 100, 60 s transaction timeout)."""
    res = run_chaos(restartable_broker, tmp_path / "chaos-shape", shape=shape, n=20000, rate=0, kills=20,
                    broker_restarts=2, broker_kills=1, zombies=1, seed=31, time_limit_s=2000)
    assert (res.kills, res.broker_restarts, res.broker_kills, res.zombies) == (20, 2, 1, 1)
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
