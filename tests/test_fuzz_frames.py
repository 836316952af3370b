"""Fuzzing of the frame, batch and codec decoders, and of Connection against a misbehaving peer.

Every decoder must either return a result or raise ``ProtocolError``: never any other
exception and never hang. The socket tests use a tiny local TCP peer that sends garbage
(no broker involved) and check that ``Connection`` fails fast and closes.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time
import tracemalloc
from collections.abc import Awaitable, Callable

import pytest
from hostile import snappy_bomb, zstd_bomb
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import txn
from txn.connection import PROTOCOL_VERSION, Connection, command, next_request_id
from txn.errors import ConnectError, ProtocolError, PulsarError, Timeout
from txn.protocol import (
    CompressionType,
    Frame,
    FrameDecoder,
    compress,
    decode_batch,
    decode_frame,
    decompress,
    encode_command,
    encode_entry,
    encode_payload_frame,
    pb,
    split_batch,
)
from txn.protocol.batch import COMPILED, NULL_PAYLOAD, split_batch_py
from txn.protocol.frames import FRAME_HEADROOM

T = pb.BaseCommand
U32 = struct.Struct(">I")

FUZZ = settings(
    max_examples=300,
    deadline=2000,  # ms per example: a hang or pathological slowness fails the test
    database=None,  # keep the working tree clean
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: For properties of valid frames (not garbage-robustness), where fewer examples suffice.
PROPS = settings(FUZZ, max_examples=150)


def _check_frames(frames: list[Frame]) -> None:
    assert isinstance(frames, list)
    for f in frames:
        assert isinstance(f, Frame)
        assert isinstance(f.command, pb.BaseCommand)
        assert f.command.IsInitialized()
        assert isinstance(f.checksum_ok, bool)
        if f.metadata is not None:
            assert isinstance(f.metadata, pb.MessageMetadata)
            assert isinstance(f.payload, bytes)
        else:
            assert f.payload is None


def _feed_all(dec: FrameDecoder, chunks: list[bytes]) -> list[Frame] | ProtocolError:
    """Feed chunks; return the frames, or the ProtocolError raised. Anything else propagates."""
    out: list[Frame] = []
    try:
        for chunk in chunks:
            frames = dec.feed(chunk)
            _check_frames(frames)
            out.extend(frames)
    except ProtocolError as exc:
        return exc
    return out


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, prev = [], 0
    for p in points:
        pieces.append(data[prev:p])
        prev = p
    pieces.append(data[prev:])
    return pieces


# --------------------------------------------------------- valid frame strategies

_names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
_u64 = st.integers(0, 2**64 - 1)


@st.composite
def simple_commands(draw: st.DrawFn) -> pb.BaseCommand:
    kind = draw(st.sampled_from(["ping", "pong", "lookup", "success", "error", "connected", "flow"]))
    rid = draw(_u64)
    if kind == "ping":
        return pb.BaseCommand(type=T.PING, ping=pb.CommandPing())
    if kind == "pong":
        return pb.BaseCommand(type=T.PONG, pong=pb.CommandPong())
    if kind == "lookup":
        return pb.BaseCommand(type=T.LOOKUP, lookupTopic=pb.CommandLookupTopic(topic=draw(_names), request_id=rid))
    if kind == "success":
        return pb.BaseCommand(type=T.SUCCESS, success=pb.CommandSuccess(request_id=rid))
    if kind == "error":
        err = draw(st.sampled_from(list(pb.ServerError.values())))
        return pb.BaseCommand(type=T.ERROR, error=pb.CommandError(request_id=rid, error=err, message=draw(_names)))
    if kind == "connected":
        return pb.BaseCommand(type=T.CONNECTED, connected=pb.CommandConnected(server_version=draw(_names)))
    return pb.BaseCommand(
        type=T.FLOW, flow=pb.CommandFlow(consumer_id=rid, messagePermits=draw(st.integers(0, 2**32 - 1)))
    )


@st.composite
def payload_frames(draw: st.DrawFn) -> tuple[bytes, pb.BaseCommand, pb.MessageMetadata, bytes, int]:
    """(frame, command, metadata, payload, offset of the CRC32C field), optionally with broker entry metadata."""
    cmd = pb.BaseCommand(type=T.SEND, send=pb.CommandSend(producer_id=draw(_u64), sequence_id=draw(_u64)))
    meta = pb.MessageMetadata(producer_name=draw(_names), sequence_id=draw(_u64), publish_time=draw(_u64))
    for k, v in draw(st.dictionaries(_names, _names, max_size=3)).items():
        meta.properties.add(key=k, value=v)
    payload = draw(st.binary(max_size=300))
    raw = encode_payload_frame(cmd, meta, payload)
    head = 8 + len(cmd.SerializeToString())
    bem = draw(st.none() | st.binary(max_size=20))
    if bem is not None:  # [magic 0x0e02][size][broker entry metadata] before the checksummed part
        section = b"\x0e\x02" + U32.pack(len(bem)) + bem
        raw = U32.pack(len(raw) - 4 + len(section)) + raw[4:head] + section + raw[head:]
        head += len(section)
    return raw, cmd, meta, payload, head + 2


@st.composite
def any_valid_frame(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):
        return encode_command(draw(simple_commands()))
    return draw(payload_frames())[0]


@st.composite
def frame_like(draw: st.DrawFn) -> bytes:
    """Bytes with a consistent total size and a plausible but arbitrary body: reaches deep into decode_frame."""
    kind = draw(st.sampled_from(["raw", "cmd_size", "command_then_junk"]))
    if kind == "raw":
        body = draw(st.binary(max_size=200))
    elif kind == "cmd_size":
        junk = draw(st.binary(max_size=200))
        body = U32.pack(draw(st.integers(0, len(junk) + 8))) + junk
    else:
        cmd = draw(simple_commands())
        if draw(st.booleans()):
            cmd_bytes = _drop_required(cmd, draw(st.booleans()))
        else:
            cmd_bytes = cmd.SerializeToString()
        magic = draw(st.sampled_from([b"", b"\x0e\x01", b"\x0e\x02", b"\x0e"]))
        size_field = draw(st.none() | st.integers(0, 2**32 - 1))
        junk = draw(st.binary(max_size=100))
        body = U32.pack(len(cmd_bytes)) + cmd_bytes + magic + (b"" if size_field is None else U32.pack(size_field))
        body += junk
    return U32.pack(len(body)) + body


def _drop_required(cmd: pb.BaseCommand, drop_type: bool) -> bytes:
    """Serialise ``cmd`` without a required field (the type, or one in its sub-message)."""
    partial = pb.BaseCommand()
    partial.CopyFrom(cmd)
    if drop_type:
        partial.ClearField("type")
    else:
        for field, _ in partial.ListFields():
            if field.message_type is not None:
                sub = getattr(partial, field.name)
                for f, _ in sub.ListFields():
                    if f.is_required:
                        sub.ClearField(f.name)
                        break
    return partial.SerializePartialToString()


# ------------------------------------------------- (a) arbitrary bytes into the decoder


@FUZZ
@given(
    data=st.one_of(st.binary(max_size=2048), frame_like(), st.lists(frame_like(), max_size=4).map(b"".join)),
    cuts=st.lists(st.integers(0, 4096), max_size=8),
    max_frame=st.sampled_from([4, 16, 256, 5 * 1024 * 1024 + FRAME_HEADROOM]),
)
def test_feed_arbitrary_bytes_only_raises_protocol_error(data: bytes, cuts: list[int], max_frame: int) -> None:
    dec = FrameDecoder(max_frame_size=max_frame)
    result = _feed_all(dec, _split(data, cuts))
    if not isinstance(result, ProtocolError):
        # Everything not returned as a frame is still buffered, and is less than one whole frame.
        assert dec.buffered <= len(data)
        if dec.buffered >= 4:
            (size,) = U32.unpack_from(data, len(data) - dec.buffered)
            assert 4 <= size <= max_frame
            assert dec.buffered - 4 < size


@FUZZ
@given(data=st.one_of(st.binary(max_size=1024), frame_like().map(lambda b: b[4:])))
def test_decode_frame_arbitrary_bytes_only_raises_protocol_error(data: bytes) -> None:
    try:
        frame = decode_frame(data)
    except ProtocolError:
        return
    _check_frames([frame])


@FUZZ
@given(
    cmd=simple_commands(),
    trailer=st.binary(max_size=64),
)
def test_valid_command_with_trailing_bytes(cmd: pb.BaseCommand, trailer: bytes) -> None:
    """A valid command followed by arbitrary bytes is parsed as a payload section or rejected."""
    body = cmd.SerializeToString()
    frame = U32.pack(len(body)) + body + trailer
    try:
        decoded = decode_frame(frame)
    except ProtocolError:
        assert trailer  # a bare command always decodes
        return
    assert decoded.command == cmd
    if not trailer:
        assert decoded.metadata is None and decoded.payload is None


# -------------------------------------------------------- (b) mutated valid frames


@PROPS
@given(frames=st.lists(any_valid_frame(), min_size=1, max_size=5), cuts=st.lists(st.integers(0, 4096), max_size=6))
def test_valid_frames_round_trip_in_any_chunking(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frames)
    result = _feed_all(FrameDecoder(), _split(stream, cuts))
    assert not isinstance(result, ProtocolError)
    expected = [decode_frame(f[4:]) for f in frames]
    assert [(f.command, f.metadata, f.payload, f.checksum_ok) for f in result] == [
        (f.command, f.metadata, f.payload, True) for f in expected
    ]


_mutations = st.sampled_from(["flip", "truncate", "total_size", "cmd_size", "insert", "delete", "overwrite"])


@FUZZ
@given(
    frame=any_valid_frame(),
    ops=st.lists(
        st.tuples(_mutations, st.integers(0, 2**32 - 1), st.binary(min_size=1, max_size=16)), min_size=1, max_size=4
    ),
    follow=st.booleans(),
    cuts=st.lists(st.integers(0, 4096), max_size=4),
)
def test_mutated_frames_only_raise_protocol_error(
    frame: bytes, ops: list[tuple[str, int, bytes]], follow: bool, cuts: list[int]
) -> None:
    data = bytearray(frame)
    for op, n, blob in ops:
        if not data:
            break
        i = n % len(data)
        if op == "flip":
            data[i] ^= 1 << (n % 8)
        elif op == "truncate":
            del data[i:]
        elif op == "total_size" and len(data) >= 4:
            data[0:4] = U32.pack(n)
        elif op == "cmd_size" and len(data) >= 8:
            data[4:8] = U32.pack(n)
        elif op == "insert":
            data[i:i] = blob
        elif op == "delete":
            del data[i : i + len(blob)]
        elif op == "overwrite":
            data[i : i + len(blob)] = blob
    if follow:
        data += encode_command(pb.BaseCommand(type=T.PING, ping=pb.CommandPing()))
    _feed_all(FrameDecoder(), _split(bytes(data), cuts))
    try:
        if len(data) >= 4:
            _check_frames([decode_frame(bytes(data[4:]))])
    except ProtocolError:
        pass


@PROPS
@given(pf=payload_frames(), data=st.data())
def test_single_bit_flip_in_checked_region_is_detected(
    pf: tuple[bytes, pb.BaseCommand, pb.MessageMetadata, bytes, int], data: st.DataObject
) -> None:
    raw, cmd, meta, payload, crc_pos = pf
    # Anywhere from the checksum itself to the end of the payload.
    pos = data.draw(st.integers(crc_pos, len(raw) - 1), label="pos")
    bit = data.draw(st.integers(0, 7), label="bit")
    mutated = bytearray(raw)
    mutated[pos] ^= 1 << bit
    try:
        (frame,) = FrameDecoder().feed(bytes(mutated))
    except ProtocolError:
        assert pos >= crc_pos + 4  # a flipped checksum never breaks parsing
        return
    # CRC32C detects every single-bit error.
    assert frame.checksum_ok is False
    assert frame.command == cmd
    payload_start = len(raw) - len(payload)
    if pos < crc_pos + 4 or pos >= payload_start:
        assert frame.metadata == meta
        expected = bytearray(payload)
        if pos >= payload_start:
            expected[pos - payload_start] ^= 1 << bit
        assert frame.payload == bytes(expected)


@PROPS
@given(frame=any_valid_frame(), data=st.data())
def test_truncated_frame_is_buffered_not_decoded(frame: bytes, data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(frame) - 1), label="cut")
    dec = FrameDecoder()
    assert dec.feed(frame[:cut]) == []
    assert dec.buffered == cut
    (decoded,) = dec.feed(frame[cut:])
    assert decoded.command == decode_frame(frame[4:]).command
    assert dec.buffered == 0


@PROPS
@given(frame=any_valid_frame(), size=st.integers(0, 2**32 - 1))
def test_corrupt_total_size(frame: bytes, size: int) -> None:
    dec = FrameDecoder(max_frame_size=4096)
    data = U32.pack(size) + frame[4:]
    try:
        frames = dec.feed(data)
    except ProtocolError:
        assert size < 4 or size > 4096 or size <= len(frame) - 4
        return
    _check_frames(frames)
    if size > len(frame) - 4:
        assert frames == [] and dec.buffered == len(data)  # waits for the rest


# ---------------------------------------------------------------- (c) batches


@FUZZ
@given(data=st.binary(max_size=1024), count=st.integers(-3, 64))
def test_decode_batch_arbitrary_bytes(data: bytes, count: int) -> None:
    try:
        out = decode_batch(data, count)
    except ProtocolError:
        return
    assert len(out) == count
    for smm, payload in out:
        assert isinstance(smm, pb.SingleMessageMetadata)
        assert len(payload) == smm.payload_size


@st.composite
def batches(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    payloads = draw(st.lists(st.binary(max_size=50), min_size=1, max_size=6))
    entries = []
    for p in payloads:
        smm = pb.SingleMessageMetadata(payload_size=len(p), event_time=draw(st.integers(0, 2**64 - 1)))
        if draw(st.booleans()):
            smm.partition_key = draw(_names)
        entries.append(encode_entry(smm, p))
    return b"".join(entries), payloads


@FUZZ
@given(
    batch=batches(),
    pos=st.integers(0, 2**31),
    bit=st.integers(0, 7),
    cut=st.integers(0, 2**31),
    extra=st.integers(-2, 3),
)
def test_decode_batch_mutated(batch: tuple[bytes, list[bytes]], pos: int, bit: int, cut: int, extra: int) -> None:
    data, payloads = batch
    out = decode_batch(data, len(payloads))
    assert [p for _, p in out] == payloads
    mutated = bytearray(data)
    mutated[pos % len(mutated)] ^= 1 << bit
    mutated = mutated[: len(mutated) - cut % (len(mutated) + 1)]
    count = max(0, len(payloads) + extra)
    try:
        out = decode_batch(bytes(mutated), count)
    except ProtocolError:
        return
    assert len(out) == count


def _as_items(out: list[tuple[pb.SingleMessageMetadata, bytes]]) -> list[tuple]:
    """decode_batch's result in split_batch's form (a null-value message is a tombstone, whatever
    bytes its entry holds: split_batch hands out ``NULL_PAYLOAD``, as for a null value from any producer)."""
    return [
        (
            NULL_PAYLOAD if smm.null_value else payload,
            smm.sequence_id if smm.HasField("sequence_id") else None,
            smm.event_time,
            smm.partition_key if smm.HasField("partition_key") else None,
            [(kv.key, kv.value) for kv in smm.properties] or None,
            smm.compacted_out,
            smm.ordering_key if smm.HasField("ordering_key") else None,
        )
        for smm, payload in out
    ]


#: The pure Python split and, where it was built, the compiled one (``split_batch`` uses it).
SPLITS = [split_batch_py, split_batch] if COMPILED else [split_batch_py]


def _same_as_decode_batch(data: bytes, count: int) -> None:
    """split_batch (fast paths, pure and compiled) must accept, reject and read exactly what
    decode_batch does."""
    try:
        want = _as_items(decode_batch(data, count))
    except ProtocolError:
        for split in SPLITS:
            with pytest.raises(ProtocolError):
                split(data, count)
        return
    for split in SPLITS:
        assert split(data, count) == want


_varint_fields = st.sampled_from([0x18, 0x20, 0x28, 0x40, 0x12, 0x30, 0x0A, 0x3A, 0x48, 0x50, 0x98])


@st.composite
def smm_like(draw: st.DrawFn) -> bytes:
    """Metadata that stresses the fast path: any field order, repeats, long or odd varints."""
    out = bytearray()
    for _ in range(draw(st.integers(0, 6))):
        tag = draw(_varint_fields)
        out.append(tag)
        if tag == 0x98:
            out.append(0x01)  # a two-byte tag (field 19): unknown, kept by protobuf
        if tag in (0x12, 0x0A, 0x3A):
            body = draw(st.binary(max_size=8))
            out.append(len(body))
            out += body
            continue
        value = draw(st.integers(0, 2**70))
        while True:
            b, value = value & 0x7F, value >> 7
            out.append(b | (0x80 if value else 0))
            if not value:
                break
        if draw(st.booleans()) and out:
            out[-1] |= 0x80  # unterminated / over-long varint
            out += draw(st.binary(max_size=3))
    return bytes(out)


@FUZZ
@given(data=st.binary(max_size=512), count=st.integers(-2, 16))
def test_split_batch_matches_decode_batch_on_arbitrary_bytes(data: bytes, count: int) -> None:
    _same_as_decode_batch(data, count)


@FUZZ
@given(metas=st.lists(smm_like(), min_size=1, max_size=5), payload=st.binary(max_size=40), extra=st.integers(-1, 1))
@example(metas=[b"\x18\x01\x48\x01"], payload=b"\x00", extra=0)  # null_value over a 1-byte payload (found here)
def test_split_batch_matches_decode_batch_on_odd_metadata(metas: list[bytes], payload: bytes, extra: int) -> None:
    data = b"".join(struct.pack(">I", len(m)) + m + payload for m in metas)
    _same_as_decode_batch(data, len(metas) + extra)


@FUZZ
@given(batch=batches(), pos=st.integers(0, 2**31), bit=st.integers(0, 7))
def test_split_batch_matches_decode_batch_on_mutated_batches(batch: tuple[bytes, list[bytes]], pos: int,
                                                              bit: int) -> None:
    data, payloads = batch
    _same_as_decode_batch(data, len(payloads))
    mutated = bytearray(data)
    mutated[pos % len(mutated)] ^= 1 << bit
    _same_as_decode_batch(bytes(mutated), len(payloads))


def test_split_batch_reads_every_field() -> None:
    smm = pb.SingleMessageMetadata(payload_size=3, sequence_id=2**40, event_time=7, partition_key="k\u00e9",
                                   compacted_out=True, ordering_key=b"o\xff")
    smm.properties.add(key="a", value="b")
    plain = pb.SingleMessageMetadata(payload_size=2, sequence_id=300)
    null = pb.SingleMessageMetadata(payload_size=1, null_value=True)  # a tombstone whose entry holds a byte
    keyed = pb.SingleMessageMetadata(payload_size=1, sequence_id=5, partition_key="p", event_time=2**62)
    data = (encode_entry(smm, b"abc") + encode_entry(plain, b"xy") + encode_entry(null, b"\x00")
            + encode_entry(keyed, b"z"))
    for split in SPLITS:
        out = split(data, 4)
        assert out == [
            (b"abc", 2**40, 7, "k\u00e9", [("a", "b")], True, b"o\xff"),
            (b"xy", 300, 0, None, None, False, None),
            (b"", None, 0, None, None, False, None),
            (b"z", 5, 2**62, "p", None, False, None),
        ]
        assert out[2][0] is NULL_PAYLOAD and out[0][0] is not NULL_PAYLOAD


# ---------------------------------------------------------------- (d) codecs

_codecs = st.sampled_from([*CompressionType, 5, 99, -1])


@FUZZ
@given(codec=_codecs, data=st.binary(max_size=512), size=st.integers(0, 1 << 16))
def test_decompress_arbitrary_bytes(codec: int, data: bytes, size: int) -> None:
    try:
        out = decompress(codec, data, size)
    except ProtocolError:
        assert codec != CompressionType.NONE
        return
    assert isinstance(out, bytes)
    assert codec in set(CompressionType)
    if codec == CompressionType.NONE:
        assert out == data
    else:
        assert len(out) == size


@FUZZ
@given(
    codec=st.sampled_from([c for c in CompressionType if c != CompressionType.NONE]),
    plain=st.binary(max_size=512),
    pos=st.integers(0, 2**31),
    bit=st.integers(0, 7),
    cut=st.integers(0, 16),
    size_delta=st.sampled_from([0, 0, 0, -1, 1, 1000]),
)
def test_decompress_mutated(
    codec: CompressionType, plain: bytes, pos: int, bit: int, cut: int, size_delta: int
) -> None:
    packed = compress(codec, plain)
    assert decompress(codec, packed, len(plain)) == plain
    mutated = bytearray(packed)
    mutated[pos % len(mutated)] ^= 1 << bit
    mutated = mutated[: max(0, len(mutated) - cut)]
    size = max(0, len(plain) + size_delta)
    try:
        out = decompress(codec, bytes(mutated), size)
    except ProtocolError:
        return
    assert len(out) == size


def _stating(codec: CompressionType, size: int) -> bytes:
    """A payload of ``codec`` that decodes (or says it decodes) to ``size`` zero bytes."""
    if codec == CompressionType.ZSTD:
        return zstd_bomb(size)
    if codec == CompressionType.SNAPPY:
        return snappy_bomb(size // 64)
    return compress(codec, bytes(size))


@settings(FUZZ, max_examples=60, deadline=None)
@given(
    codec=st.sampled_from([c for c in CompressionType if c != CompressionType.NONE]),
    stated=st.integers(0, 8 * 1024 * 1024),
    declared=st.integers(0, 64 * 1024),
    limit=st.sampled_from([1024, 64 * 1024, 5 * 1024 * 1024]),
)
def test_decompress_never_allocates_past_the_declared_size(codec: CompressionType, stated: int, declared: int,
                                                           limit: int) -> None:
    """Whatever a payload decodes to or states, the output never outgrows min(declared, limit)."""
    data = _stating(codec, stated)
    decompress(codec, compress(codec, b"warm"), 4)  # first-call allocations are not the payload's
    tracemalloc.start()
    try:
        try:
            out = decompress(codec, data, declared, limit)
        except ProtocolError:
            out = None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= min(declared, limit) + 256 * 1024, f"{peak} bytes traced for declared={declared}"
    if out is not None:
        assert len(out) == declared <= limit


# ------------------------------------------------------- (e) misbehaving TCP peer

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_frame(reader: asyncio.StreamReader) -> Frame:
    (size,) = U32.unpack(await reader.readexactly(4))
    return decode_frame(await reader.readexactly(size))


async def _until_closed(reader: asyncio.StreamReader) -> str:
    """Read until the client closes: 'eof' (FIN) or 'reset' (RST)."""
    try:
        while await reader.read(65536):
            pass
    except ConnectionResetError:
        return "reset"
    return "eof"


class Peer:
    """A local TCP peer running one scripted session per connection."""

    def __init__(self, script: Callable[[Peer, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]):
        self.script = script
        self.connects: list[pb.CommandConnect] = []
        self.requests: list[pb.BaseCommand] = []
        self.closed_how: asyncio.Future[str] | None = None
        self.server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> Peer:
        self.closed_how = asyncio.get_running_loop().create_future()
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await _read_frame(reader)
            assert first.command.type == T.CONNECT
            self.connects.append(first.command.connect)
            await self.script(self, reader, writer)
            how = await _until_closed(reader)
        except Exception as exc:  # surface script failures in the test, not as a hang
            how = f"error: {exc!r}"
        finally:
            writer.close()
        assert self.closed_how is not None
        if not self.closed_how.done():
            self.closed_how.set_result(how)


def _garbage(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _connected_frame(max_message_size: int | None = None) -> bytes:
    conn = pb.CommandConnected(server_version="garbage-peer", protocol_version=PROTOCOL_VERSION)
    if max_message_size is not None:
        conn.max_message_size = max_message_size
    return encode_command(pb.BaseCommand(type=T.CONNECTED, connected=conn))


_incomplete_connected = pb.BaseCommand(type=T.CONNECTED, connected=pb.CommandConnected()).SerializePartialToString()

MALFORMED_REPLIES = {
    # total 8: command size 100 does not fit, followed by random garbage
    "cmd_size_exceeds_frame": U32.pack(8) + U32.pack(100) + b"\x08\x03\x1a\x00" + _garbage(300, 1),
    "oversized_frame": b"\xff\xff\xff\xff" + _garbage(300, 2),
    "frame_size_too_small": U32.pack(2) + b"\x00\x00" + _garbage(300, 3),
    "zero_command_size": U32.pack(4) + U32.pack(0) + _garbage(300, 4),
    "undecodable_command": U32.pack(6) + U32.pack(2) + b"\xff\xff" + _garbage(300, 5),
    "required_field_missing": U32.pack(4 + len(_incomplete_connected))
    + U32.pack(len(_incomplete_connected))
    + _incomplete_connected,
    "random_garbage": bytes([0x80]) + _garbage(1000, 6),  # first u32 > 2 GiB
}


def _run(coro: Awaitable[object]) -> object:
    return asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


@pytest.mark.parametrize("reply", list(MALFORMED_REPLIES))
def test_open_fails_fast_on_malformed_handshake_reply(reply: str) -> None:
    async def script(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(MALFORMED_REPLIES[reply])
        await writer.drain()

    async def main() -> None:
        async with Peer(script) as peer:
            conn = Connection("127.0.0.1", peer.port, operation_timeout=5)
            t0 = time.monotonic()
            with pytest.raises(PulsarError) as info:
                await asyncio.wait_for(conn.open(), 8)
            elapsed = time.monotonic() - t0
            assert type(info.value) is ProtocolError
            assert elapsed < 3, f"open() took {elapsed:.2f}s to fail"
            assert conn.closed is True
            assert conn.close_reason is info.value
            # The peer sees the client close the socket.
            how = await asyncio.wait_for(asyncio.shield(peer.closed_how), 5)
            assert how in ("eof", "reset")
            # The CONNECT the client sent was well formed.
            (connect,) = peer.connects
            assert connect.client_version == f"txn-python-{txn.__version__}"
            assert connect.protocol_version == PROTOCOL_VERSION
            assert connect.feature_flags.supports_auth_refresh is True
            with pytest.raises(ConnectError):
                conn.send_command(pb.BaseCommand(type=T.PING, ping=pb.CommandPing()))

    _run(main())


@pytest.mark.parametrize("mode", ["close_immediately", "partial_frame_then_close", "partial_connected_then_close"])
def test_open_fails_fast_when_peer_hangs_up(mode: str) -> None:
    async def script(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if mode == "partial_frame_then_close":
            writer.write(U32.pack(100) + b"\x00\x00")
        elif mode == "partial_connected_then_close":
            writer.write(_connected_frame()[:-3])
        await writer.drain()
        writer.close()

    async def main() -> None:
        async with Peer(script) as peer:
            conn = Connection("127.0.0.1", peer.port, operation_timeout=5)
            t0 = time.monotonic()
            with pytest.raises(PulsarError) as info:
                await asyncio.wait_for(conn.open(), 8)
            assert type(info.value) is ConnectError
            assert time.monotonic() - t0 < 3
            assert conn.closed is True

    _run(main())


def test_open_times_out_on_silent_peer() -> None:
    async def script(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        return  # say nothing; _handle then waits for the client to close

    async def main() -> None:
        async with Peer(script) as peer:
            conn = Connection("127.0.0.1", peer.port, operation_timeout=0.5)
            t0 = time.monotonic()
            with pytest.raises(PulsarError) as info:
                await asyncio.wait_for(conn.open(), 5)
            elapsed = time.monotonic() - t0
            assert type(info.value) is Timeout
            assert 0.4 < elapsed < 3
            assert conn.closed is True
            assert await asyncio.wait_for(asyncio.shield(peer.closed_how), 5) in ("eof", "reset")

    _run(main())


def test_open_fails_when_nothing_listens() -> None:
    async def main() -> None:
        async with Peer(lambda *a: asyncio.sleep(0)) as peer:
            port = peer.port
        conn = Connection("127.0.0.1", port, operation_timeout=5)
        with pytest.raises(ConnectError):
            await asyncio.wait_for(conn.open(), 8)

    _run(main())


GARBAGE_AFTER_CONNECTED = {
    "cmd_size_exceeds_frame": U32.pack(8) + U32.pack(100) + b"\x08\x03\x1a\x00" + _garbage(200, 11),
    "random_garbage": bytes([0xC0]) + _garbage(500, 12),
    "undecodable_command": U32.pack(6) + U32.pack(2) + b"\xff\xff",
    # larger than the max_message_size the peer announced (1000 + headroom), though under the default
    "over_negotiated_limit": U32.pack(1000 + FRAME_HEADROOM + 1) + b"\x00" * 64,
}


@pytest.mark.parametrize("garbage", list(GARBAGE_AFTER_CONNECTED))
def test_garbage_after_handshake_fails_pending_request(garbage: str) -> None:
    async def script(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_connected_frame(max_message_size=1000))
        await writer.drain()
        # Wait for the client's request, then answer it with garbage.
        frame = await _read_frame(reader)
        peer.requests.append(frame.command)
        writer.write(GARBAGE_AFTER_CONNECTED[garbage])
        await writer.drain()

    async def main() -> None:
        async with Peer(script) as peer:
            conn = Connection("127.0.0.1", peer.port, operation_timeout=5)
            assert await asyncio.wait_for(conn.open(), 8) is conn
            assert conn.closed is False
            assert conn.server_version == "garbage-peer"
            assert conn.protocol_version == PROTOCOL_VERSION
            assert conn.max_message_size == 1000
            assert conn.decoder.max_frame_size == 1000 + FRAME_HEADROOM

            closes: list[BaseException] = []
            conn.close_listeners.append(lambda c, reason: closes.append(reason))

            rid = next_request_id()
            req = command(T.PARTITIONED_METADATA, topic="persistent://public/default/fuzz", request_id=rid)
            t0 = time.monotonic()
            task = asyncio.ensure_future(conn.request(req, rid))
            with pytest.raises(PulsarError) as info:
                await asyncio.wait_for(task, 8)
            elapsed = time.monotonic() - t0
            assert type(info.value) is ConnectError  # pending requests fail with ConnectError
            assert "closed before the response" in str(info.value)
            assert elapsed < 3, f"request took {elapsed:.2f}s to fail"
            assert conn.closed is True
            assert type(conn.close_reason) is ProtocolError
            assert len(closes) == 1 and closes[0] is conn.close_reason
            assert conn.pending_request_count() == 0

            # The peer got exactly the request we sent, then saw the socket close.
            (sent,) = peer.requests
            assert sent.type == T.PARTITIONED_METADATA
            assert sent.partitionMetadata.request_id == rid
            assert sent.partitionMetadata.topic == "persistent://public/default/fuzz"
            assert await asyncio.wait_for(asyncio.shield(peer.closed_how), 5) in ("eof", "reset")

            # Further use fails at once.
            with pytest.raises(ConnectError):
                await asyncio.wait_for(conn.request(req, next_request_id()), 2)
            with pytest.raises(ConnectError):
                conn.send_command(pb.BaseCommand(type=T.PING, ping=pb.CommandPing()))

    _run(main())


def test_garbage_after_handshake_closes_idle_connection() -> None:
    async def script(peer: Peer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(_connected_frame())
        await writer.drain()
        # Wait for the client's PING so that CONNECTED and the garbage arrive in separate reads.
        frame = await _read_frame(reader)
        peer.requests.append(frame.command)
        writer.write(b"\xde\xad\xbe\xef" + _garbage(100, 21))
        await writer.drain()

    async def main() -> None:
        async with Peer(script) as peer:
            conn = Connection("127.0.0.1", peer.port, operation_timeout=5)
            await asyncio.wait_for(conn.open(), 8)
            assert conn.max_message_size == 5 * 1024 * 1024  # not announced: the default stays
            conn.send_command(pb.BaseCommand(type=T.PING, ping=pb.CommandPing()))
            t0 = time.monotonic()
            while not conn.closed and time.monotonic() - t0 < 3:
                await asyncio.sleep(0.01)
            assert conn.closed is True
            assert type(conn.close_reason) is ProtocolError
            assert "exceeds the limit" in str(conn.close_reason)
            assert [c.type for c in peer.requests] == [T.PING]
            assert await asyncio.wait_for(asyncio.shield(peer.closed_how), 5) in ("eof", "reset")
            with pytest.raises(ConnectError):
                await conn.request(pb.BaseCommand(type=T.PING, ping=pb.CommandPing()), next_request_id())

    _run(main())
