"""Sizes and counts from outside are bounded before memory is spent on them; corrupt messages are
reported, never skipped (issue 9, section 5).

Payloads that lie are stored on the real broker (it never decodes a payload); frames a real
broker never sends (bad checksums, absurd partition counts and frame limits) come from the
loopback fake broker in ``hostile.py``. Memory is measured as the peak RSS of a child process.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hostile import U32, Entry, FakeBroker, MiB, send_raw, snappy_bomb, zstd_bomb

import txn
from txn.connection import MAX_MESSAGE_SIZE_CEILING, Connection
from txn.delivery.processor import AsyncProcessor, ProcessorConfig
from txn.errors import SizeLimitExceeded
from txn.protocol import CompressionType, FrameDecoder, compress, decompress
from txn.protocol.frames import DEFAULT_MAX_MESSAGE_SIZE, FRAME_HEADROOM

TESTS = Path(__file__).parent
#: Extra peak RSS allowed while one hostile payload is handled (the old code took 256 MiB and more).
RSS_BOUND = 50 * MiB
BOMB = 256 * MiB
#: Snappy expands at most ~21x, so this is about the most a 5 MiB message can state.
SNAPPY_BOMB = 96 * MiB


def _child(code: str, *args: str, limit_as: int | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (tests/ on its path); it prints one JSON line last."""
    prelude = f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
    if limit_as is not None:
        prelude += f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit_as}, {limit_as}))\n"
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------- codecs, no broker

_DECODE_CHILD = """
    import json, sys
    from hostile import peak_rss
    from txn.protocol import decompress
    codec, declared, limit = (int(a) for a in sys.argv[2:5])
    payloads = [open(p, "rb").read() for p in sys.argv[1].split(",")]
    base = peak_rss()
    errors = []
    for data in payloads:
        try:
            decompress(codec, data, declared, limit)
            errors.append(None)
        except Exception as exc:
            errors.append(type(exc).__name__)
    print(json.dumps({"errors": errors, "grew": peak_rss() - base}))
"""


@pytest.mark.parametrize("codec", ["ZSTD", "SNAPPY"])
def test_decompress_rejects_a_stated_size_before_allocating(codec: str, tmp_path: Path) -> None:
    """A payload stating 256 MiB (Snappy: 96 MiB) while its metadata says 1000 bytes costs no
    memory (ZSTD: with and without the size in its frame header)."""
    if codec == "ZSTD":
        bombs = [zstd_bomb(BOMB), zstd_bomb(BOMB, state_size=False)]
        expected = ["SizeLimitExceeded", "ProtocolError"]
    else:
        bombs = [snappy_bomb(SNAPPY_BOMB // 64)]
        expected = ["SizeLimitExceeded"]
    files = []
    for i, b in enumerate(bombs):
        f = tmp_path / f"bomb{i}"
        f.write_bytes(b)
        files.append(str(f))
    out = _child(_DECODE_CHILD, ",".join(files), str(int(CompressionType[codec])), "1000", str(5 * MiB))
    assert out["errors"] == expected
    assert out["grew"] < RSS_BOUND, f"peak RSS grew by {out['grew'] / MiB:.0f} MiB"


@pytest.mark.parametrize("codec", [c for c in CompressionType if c != CompressionType.NONE], ids=lambda c: c.name)
def test_decompress_bounds_declared_size_by_limit(codec: CompressionType) -> None:
    plain = bytes(2 * MiB)
    packed = compress(codec, plain)
    assert decompress(codec, packed, len(plain), 2 * MiB) == plain
    with pytest.raises(SizeLimitExceeded, match="exceeds the limit of 1048576"):
        decompress(codec, packed, len(plain), 1 * MiB)
    # A size the payload states itself must match the metadata's.
    if codec in (CompressionType.ZSTD, CompressionType.SNAPPY):
        with pytest.raises(SizeLimitExceeded, match="the metadata declares 1000"):
            decompress(codec, packed, 1000, 2 * MiB)


# --------------------------------------------------- lying payloads, real broker

_CONSUME_CHILD = """
    import json, sys
    import txn
    from hostile import peak_rss
    url, topic, bomb_entry = sys.argv[1], sys.argv[2], int(sys.argv[3])
    client = txn.Client(url, operation_timeout_seconds=20)
    base = peak_rss()

    def take(read):
        try:
            return read(10000).data().decode()
        except txn.CorruptMessage as exc:
            assert exc.topic == topic and exc.message_id.entry_id() == bomb_entry, exc
            return type(exc).__name__

    c = client.subscribe(topic, "s", initial_position=txn.InitialPosition.Earliest)
    got = [take(c.receive) for _ in range(3)]
    c.close()
    r = client.create_reader(topic, txn.EARLIEST)
    read = [take(r.read_next) for _ in range(3)]
    r.close()
    client.close()
    print(json.dumps({"consumer": got, "reader": read, "grew": peak_rss() - base}))
"""


def _store(broker, topic: str, hostile: bytes, codec: CompressionType) -> txn.MessageId:
    async def go() -> txn.MessageId:
        async with txn.AsyncClient(broker.service_url) as c:
            await send_raw(c, topic, b"before")
            mid = await send_raw(c, topic, hostile, codec=codec, uncompressed_size=1000)
            await send_raw(c, topic, b"after")
            return mid

    return asyncio.run(go())


@pytest.mark.parametrize("codec", [CompressionType.ZSTD, CompressionType.SNAPPY], ids=lambda c: c.name)
def test_lying_message_is_reported_in_place_with_bounded_memory(broker, topic, codec: CompressionType) -> None:
    """Consumer and Reader: the message before, then a typed error for the liar, then the one after."""
    hostile = zstd_bomb(BOMB) if codec == CompressionType.ZSTD else snappy_bomb(SNAPPY_BOMB // 64)
    mid = _store(broker, topic, hostile, codec)
    out = _child(_CONSUME_CHILD, broker.service_url, topic, str(mid.entry_id()))
    assert out["consumer"] == ["before", "PayloadTooLarge", "after"]
    assert out["reader"] == ["before", "PayloadTooLarge", "after"]
    assert out["grew"] < RSS_BOUND, f"peak RSS grew by {out['grew'] / MiB:.0f} MiB"


@pytest.mark.parametrize("codec", [c for c in CompressionType if c != CompressionType.NONE], ids=lambda c: c.name)
def test_payload_over_the_limit_is_typed_and_the_option_admits_it(broker, topic, codec: CompressionType) -> None:
    """6 MiB that compress well pass the broker's 5 MiB limit; by default a consumer reports them
    (PayloadTooLarge) and goes on, and ``max_uncompressed_message_size`` admits them."""
    big = bytes(6 * MiB)

    async def go() -> tuple[list[object], bytes]:
        async with txn.AsyncClient(broker.service_url) as c:
            p = await c.create_producer(topic, compression_type=codec, batching_enabled=False)
            big_id = await p.send(big)
            await p.send(b"small")
            cons = await c.subscribe(topic, "default", initial_position=txn.InitialPosition.Earliest)
            seen: list[object] = []
            for _ in range(2):
                try:
                    seen.append((await cons.receive(10000)).data())
                except txn.PayloadTooLarge as exc:
                    assert exc.message_id.entry_key[:2] == big_id.entry_key[:2]
                    assert exc.topic == topic and exc.reason == "size"
                    seen.append("PayloadTooLarge")
        async with txn.AsyncClient(broker.service_url, max_uncompressed_message_size=8 * MiB) as c:
            cons = await c.subscribe(topic, "admit", initial_position=txn.InitialPosition.Earliest)
            return seen, (await cons.receive(10000)).data()

    seen, admitted = asyncio.run(go())
    assert seen == ["PayloadTooLarge", b"small"]
    assert admitted == big


def test_processor_parks_an_unreadable_input_and_goes_on(broker, unique_name) -> None:
    """A lying input is no poison pill: it is parked (with the reason) and the others are processed."""
    from txn.delivery.processor import PARK_CORRUPT, PARK_SOURCE_ID
    from txn.delivery.replay import read_ledger

    inp, out, ledger = (f"persistent://public/default/{unique_name(n)}" for n in ("in", "out", "ledger"))
    mid = _store(broker, inp, zstd_bomb(BOMB), CompressionType.ZSTD)

    async def main():
        async with txn.AsyncClient(broker.service_url) as client:
            verify = await client.subscribe(out, "verify", initial_position=txn.InitialPosition.Earliest)
            parked = await client.subscribe(inp + "-parked", "verify", initial_position=txn.InitialPosition.Earliest)
            conf = ProcessorConfig(inputs=[inp], output=out, subscription="proc", job="hostile", ledger_topic=ledger)
            proc = AsyncProcessor(client, lambda m: m.data(), conf)
            await proc.start()
            try:
                await asyncio.wait_for(proc.run(idle_exit_ms=3000), 60)
            finally:
                await proc.close()
            outs = sorted([(await verify.receive(10000)).data() for _ in range(2)])
            p = await parked.receive(10000)
            left = await client.subscribe(inp, "proc")
            with pytest.raises(txn.Timeout):
                await left.receive(2000)  # the unreadable entry was acknowledged with its parking
            return proc.stats, outs, p, await read_ledger(client, ledger)

    stats, outs, p, records = asyncio.run(main())
    assert (stats.messages, stats.parked) == (2, 1)
    assert outs == [b"after", b"before"]
    assert p.data() == b"" and p.properties()[PARK_CORRUPT] == "size"
    assert p.properties()[PARK_SOURCE_ID] == str(txn.MessageId(ledger_id=mid.ledger_id(), entry_id=mid.entry_id()))
    (rec,) = [r for r in records if r.kind == "PARKED"]
    assert rec.inputs == {inp: [p.properties()[PARK_SOURCE_ID]]} and "PayloadTooLarge" in rec.error


# ---------------------------------------------------------- fake broker: checksums


def _checksum_entries() -> list[Entry]:
    return [Entry(0, b"m0"), Entry(1, b"m1", corrupt=True), Entry(2, b"m2")]


def test_checksum_mismatch_is_raised_by_receive_and_left_unacked() -> None:
    async def go() -> tuple[list[object], list[tuple[int, int]]]:
        async with FakeBroker(entries=_checksum_entries()) as fb:
            async with txn.AsyncClient(fb.url, operation_timeout_seconds=5) as c:
                cons = await c.subscribe("t", "s", ack_grouping_time_ms=10)
                seen: list[object] = []
                for _ in range(3):
                    try:
                        m = await cons.receive(5000)
                    except txn.ChecksumMismatch as exc:
                        assert exc.topic == "persistent://public/default/t" and exc.reason == "checksum"
                        seen.append(("checksum", exc.message_id.ledger_id(), exc.message_id.entry_id()))
                        continue
                    seen.append(m.data())
                    await cons.acknowledge(m)
                assert cons.receive_nowait() is None  # nothing else queued, and the consumer still works
                await cons.close()
            return seen, fb.acked

    seen, acked = asyncio.run(asyncio.wait_for(go(), 30))
    assert seen == [b"m0", ("checksum", 7, 1), b"m2"]
    assert sorted(acked) == [(7, 0), (7, 2)]


def test_checksum_mismatch_is_raised_by_a_reader() -> None:
    async def go() -> list[object]:
        async with FakeBroker(entries=[*_checksum_entries(), Entry(3, b"m3", corrupt=True, batch=3)]) as fb:
            async with txn.AsyncClient(fb.url, operation_timeout_seconds=5) as c:
                r = await c.create_reader("t", txn.EARLIEST)
                seen: list[object] = []
                for _ in range(4):
                    try:
                        seen.append((await r.read_next(5000)).data())
                    except txn.CorruptMessage as exc:
                        seen.append((type(exc).__name__, exc.message_id.entry_id()))
                await r.close()
            return seen

    assert asyncio.run(asyncio.wait_for(go(), 30)) == [b"m0", ("ChecksumMismatch", 1), b"m2",
                                                        ("ChecksumMismatch", 3)]


# -------------------------------------------------- fake broker: counts and limits


def test_partition_count_is_capped() -> None:
    async def go() -> list[str]:
        async with FakeBroker(partitions=70000) as fb:
            async with txn.AsyncClient(fb.url, operation_timeout_seconds=5) as c:
                with pytest.raises(txn.TooManyPartitions, match="70000 partitions") as info:
                    await c.get_topic_partitions("t")
                assert info.value.topic == "persistent://public/default/t"
                with pytest.raises(txn.TooManyPartitions):
                    await c.subscribe("t", "s")
            async with txn.AsyncClient(fb.url, operation_timeout_seconds=5, max_partitions=70000) as c:
                return await c.get_topic_partitions("t")

    names = asyncio.run(asyncio.wait_for(go(), 30))
    assert len(names) == 70000 and names[-1] == "persistent://public/default/t-partition-69999"


def test_absurd_partition_count_costs_no_memory() -> None:
    """2^32-1 partitions: a typed error at once (the old code ran out of memory building names)."""
    out = _child("""
        import asyncio, json
        import txn
        from hostile import FakeBroker

        async def go():
            async with FakeBroker(partitions=2**32 - 1) as fb:
                async with txn.AsyncClient(fb.url, operation_timeout_seconds=5) as c:
                    try:
                        await c.get_topic_partitions("t")
                    except Exception as exc:
                        return type(exc).__name__
            return "no error"

        print(json.dumps({"error": asyncio.run(go())}))
    """, limit_as=2048 * MiB)
    assert out == {"error": "TooManyPartitions"}


def test_announced_max_message_size_is_clamped() -> None:
    """CONNECTED with max_message_size 2^31-1 cannot make the client buffer a 300 MB frame."""

    async def go() -> None:
        async with FakeBroker(max_message_size=2**31 - 1) as fb:
            conn = Connection("127.0.0.1", fb.port, operation_timeout=5)
            await conn.open()
            assert conn.max_message_size == MAX_MESSAGE_SIZE_CEILING == 100 * MiB
            assert conn.decoder.max_frame_size == MAX_MESSAGE_SIZE_CEILING + FRAME_HEADROOM
            # A frame header announcing 300 MB is refused before any of its bytes are kept.
            conn.data_received(U32.pack(300 * 1000 * 1000) + bytes(64 * 1024))
            assert conn.closed and isinstance(conn.close_reason, txn.ProtocolError)
            assert "exceeds the limit" in str(conn.close_reason)
            assert conn.decoder.buffered <= 64 * 1024 + 4
            # Under the ceiling, a frame is buffered only as its bytes arrive (never preallocated).
            dec = FrameDecoder(max_frame_size=conn.decoder.max_frame_size)
            assert dec.feed(U32.pack(90 * MiB) + bytes(1000)) == [] and dec.buffered == 1004

            small = Connection("127.0.0.1", fb.port, operation_timeout=5, max_message_size_ceiling=10 * MiB)
            await small.open()
            assert small.max_message_size == 10 * MiB
            small.close()
        for announced in (0, -5):
            async with FakeBroker(max_message_size=announced) as fb:
                conn = Connection("127.0.0.1", fb.port, operation_timeout=5)
                await conn.open()
                assert conn.max_message_size == DEFAULT_MAX_MESSAGE_SIZE
                conn.close()

    asyncio.run(asyncio.wait_for(go(), 30))



def test_projection_quarantines_a_corrupt_ledger_message(broker, topic, tmp_path: Path) -> None:
    """A ledger message that lies about its size is quarantined and the projection moves past it
    (reported by the reader, it would otherwise be retried forever)."""
    from sqlalchemy import select

    from coordinator_api import db
    from coordinator_api.engine import make_engine
    from coordinator_api.projection import Projector
    from txn.delivery.ledger import LedgerRecord

    recs = [LedgerRecord(kind="COMMITTED", job="corrupt", batch_id=f"c:{i}", txn_id=f"(0,{i})", attempt=1,
                         inputs={"in": [f"(1,{i},-1,-1)"]}, outputs={"out": 1}, started_at_ms=i,
                         ended_at_ms=i + 1).to_json() for i in (1, 2)]
    engine = make_engine(f"sqlite:///{tmp_path}/p.db")

    async def go() -> tuple[int, int, txn.MessageId]:
        async with txn.AsyncClient(broker.service_url) as c:
            await send_raw(c, topic, recs[0])
            bomb = await send_raw(c, topic, zstd_bomb(BOMB), codec=CompressionType.ZSTD, uncompressed_size=1000)
            await send_raw(c, topic, recs[1])
            proj = Projector(engine, c, None)  # type: ignore[arg-type]
            proj.follow(topic)
            st = proj.status[topic]
            for _ in range(600):  # up to ~60 s
                if st.records + st.quarantined >= 3:
                    break
                await asyncio.sleep(0.1)
            await proj.stop()
            return st.records, st.quarantined, bomb

    try:
        records, quarantined, bomb = asyncio.run(go())
        assert (records, quarantined) == (2, 1)
        with engine.connect() as conn:
            rows = conn.execute(select(db.quarantine).where(db.quarantine.c.topic == topic)).all()
            stored = conn.execute(select(db.ledger_records.c.batch_id).where(db.ledger_records.c.topic == topic)
                                  .order_by(db.ledger_records.c.id)).scalars().all()
        assert stored == ["c:1", "c:2"]
        assert [(r.msg_ledger, r.msg_entry) for r in rows] == [(bomb.ledger_id(), bomb.entry_id())]
        assert rows[0].reason.startswith("corrupt message (size): undecodable payload: ZSTD frame states 268435456")
    finally:
        engine.dispose()
