"""Pure unit tests of the protocol layer and value types: no broker, no sockets."""

from __future__ import annotations

import os
import random
import struct
import tracemalloc
import zlib

import pytest

from txn import errors
from txn.errors import InvalidTopicName, ProtocolError, PulsarError
from txn.message import MessageId, TxnID
from txn.protocol import (
    CompressionType,
    FrameDecoder,
    compress,
    crc32c,
    decode_batch,
    decode_frame,
    decompress,
    encode_command,
    encode_entry,
    encode_payload_frame,
    pb,
)
from txn.protocol.frames import DEFAULT_MAX_MESSAGE_SIZE, FRAME_HEADROOM
from txn.topic import TopicName, parse_topic

T = pb.BaseCommand
U32 = struct.Struct(">I")


# ----------------------------------------------------------------- helpers


def ping() -> pb.BaseCommand:
    return pb.BaseCommand(type=T.PING, ping=pb.CommandPing())


def send_cmd(producer_id: int = 7, sequence_id: int = 42) -> pb.BaseCommand:
    return pb.BaseCommand(type=T.SEND, send=pb.CommandSend(producer_id=producer_id, sequence_id=sequence_id))


def metadata(**extra: object) -> pb.MessageMetadata:
    meta = pb.MessageMetadata(producer_name="prod-1", sequence_id=42, publish_time=1_700_000_000_000)
    for k, v in extra.items():
        setattr(meta, k, v)
    return meta


def strip_size(frame: bytes) -> bytes:
    """decode_frame takes a frame without its leading total_size field."""
    (total,) = U32.unpack_from(frame, 0)
    assert total == len(frame) - 4
    return frame[4:]


# --------------------------------------------------------- simple frames


def test_encode_command_exact_bytes_for_ping() -> None:
    # BaseCommand{type: PING(18) -> 08 12, ping (field 18, empty) -> 92 01 00}
    assert encode_command(ping()) == bytes.fromhex("00000009 00000005 0812 920100")


def test_command_round_trip() -> None:
    cmd = pb.BaseCommand(
        type=T.PARTITIONED_METADATA,
        partitionMetadata=pb.CommandPartitionedTopicMetadata(topic="persistent://t/n/x", request_id=99),
    )
    raw = encode_command(cmd)
    assert U32.unpack_from(raw, 0)[0] == len(raw) - 4
    assert U32.unpack_from(raw, 4)[0] == len(cmd.SerializeToString())
    frame = decode_frame(strip_size(raw))
    assert frame.command == cmd
    assert frame.command.type == T.PARTITIONED_METADATA
    assert frame.command.partitionMetadata.topic == "persistent://t/n/x"
    assert frame.command.partitionMetadata.request_id == 99
    assert frame.metadata is None
    assert frame.payload is None
    assert frame.checksum_ok is True


@pytest.mark.parametrize("payload", [b"", b"x", b"hello pulsar", bytes(range(256)) * 40])
def test_payload_frame_round_trip(payload: bytes) -> None:
    cmd = send_cmd()
    meta = metadata(partition_key="k1", uncompressed_size=len(payload))
    meta.properties.add(key="a", value="1")
    raw = encode_payload_frame(cmd, meta, payload)
    frame = decode_frame(strip_size(raw))
    assert frame.command == cmd
    assert frame.command.send.producer_id == 7
    assert frame.command.send.sequence_id == 42
    assert frame.metadata == meta
    assert frame.metadata.producer_name == "prod-1"
    assert frame.metadata.partition_key == "k1"
    assert [(kv.key, kv.value) for kv in frame.metadata.properties] == [("a", "1")]
    assert frame.payload == payload
    assert type(frame.payload) is bytes
    assert frame.checksum_ok is True


def test_payload_frame_layout_and_checksum() -> None:
    cmd, meta, payload = send_cmd(), metadata(), b"abc"
    raw = encode_payload_frame(cmd, meta, payload)
    cmd_bytes, meta_bytes = cmd.SerializeToString(), meta.SerializeToString()
    checked = U32.pack(len(meta_bytes)) + meta_bytes + payload
    expected = (
        U32.pack(4 + len(cmd_bytes) + 2 + 4 + len(checked))
        + U32.pack(len(cmd_bytes))
        + cmd_bytes
        + b"\x0e\x01"
        + U32.pack(crc32c(checked))
        + checked
    )
    assert raw == expected


def test_flipped_payload_bit_fails_checksum() -> None:
    payload = b"the quick brown fox"
    raw = bytearray(encode_payload_frame(send_cmd(), metadata(), payload))
    raw[-4] ^= 0x10  # the space before "fox"
    frame = decode_frame(strip_size(bytes(raw)))
    assert frame.checksum_ok is False
    assert frame.payload == b"the quick brown0fox"
    assert frame.metadata == metadata()


def test_flipped_checksum_bit_fails_checksum() -> None:
    cmd = send_cmd()
    raw = bytearray(encode_payload_frame(cmd, metadata(), b"p"))
    crc_pos = 8 + len(cmd.SerializeToString()) + 2
    raw[crc_pos] ^= 0x01
    assert decode_frame(strip_size(bytes(raw))).checksum_ok is False


def test_payload_frame_with_broker_entry_metadata() -> None:
    cmd, meta, payload = send_cmd(), metadata(), b"data"
    cmd_bytes, meta_bytes = cmd.SerializeToString(), meta.SerializeToString()
    bem = b"\x08\x01\x10\x02"  # opaque to the decoder: it is skipped
    checked = U32.pack(len(meta_bytes)) + meta_bytes + payload
    body = (
        U32.pack(len(cmd_bytes))
        + cmd_bytes
        + b"\x0e\x02"
        + U32.pack(len(bem))
        + bem
        + b"\x0e\x01"
        + U32.pack(crc32c(checked))
        + checked
    )
    frame = decode_frame(body)
    assert frame.command == cmd
    assert frame.metadata == meta
    assert frame.payload == b"data"
    assert frame.checksum_ok is True


def test_payload_frame_without_checksum() -> None:
    cmd, meta = send_cmd(), metadata()
    cmd_bytes, meta_bytes = cmd.SerializeToString(), meta.SerializeToString()
    body = U32.pack(len(cmd_bytes)) + cmd_bytes + U32.pack(len(meta_bytes)) + meta_bytes + b"raw"
    frame = decode_frame(body)
    assert frame.metadata == meta
    assert frame.payload == b"raw"
    assert frame.checksum_ok is True


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00\x00\x00",
        U32.pack(0),  # zero command size
        U32.pack(5) + b"\x08\x12",  # command size exceeds the frame
        U32.pack(2) + b"\xff\xff",  # undecodable protobuf
        U32.pack(2) + b"\x10\x01",  # valid protobuf, required 'type' missing
    ],
)
def test_decode_frame_malformed_raises_protocol_error(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_frame(body)


def test_decode_frame_truncated_payload_sections() -> None:
    raw = strip_size(encode_payload_frame(send_cmd(), metadata(), b"payload"))
    cmd_len = len(send_cmd().SerializeToString())
    # Cut inside the magic, the checksum, the metadata size and the metadata.
    for cut in (4 + cmd_len + 1, 4 + cmd_len + 4, 4 + cmd_len + 8, 4 + cmd_len + 12):
        with pytest.raises(ProtocolError):
            decode_frame(raw[:cut])


def test_decode_frame_metadata_missing_required_fields() -> None:
    cmd = send_cmd()
    meta = pb.MessageMetadata(producer_name="p")  # sequence_id and publish_time missing
    meta_bytes = meta.SerializePartialToString()
    checked = U32.pack(len(meta_bytes)) + meta_bytes
    cmd_bytes = cmd.SerializeToString()
    body = U32.pack(len(cmd_bytes)) + cmd_bytes + b"\x0e\x01" + U32.pack(crc32c(checked)) + checked
    with pytest.raises(ProtocolError, match="missing required fields"):
        decode_frame(body)


# ----------------------------------------------------------- FrameDecoder


def _sample_frames() -> list[bytes]:
    out = [encode_command(ping())]
    for i in range(6):
        payload = os.urandom(i * 37)
        out.append(encode_payload_frame(send_cmd(producer_id=i, sequence_id=i * 10), metadata(), payload))
        out.append(
            encode_command(
                pb.BaseCommand(
                    type=T.LOOKUP,
                    lookupTopic=pb.CommandLookupTopic(topic=f"persistent://t/n/topic-{i}", request_id=i),
                )
            )
        )
    return out


def _summary(frames: list) -> list[tuple]:
    return [(f.command.SerializeToString(), f.metadata, f.payload, f.checksum_ok) for f in frames]


def test_frame_decoder_whole_buffer() -> None:
    raws = _sample_frames()
    dec = FrameDecoder()
    frames = dec.feed(b"".join(raws))
    assert len(frames) == len(raws) == 13
    assert _summary(frames) == _summary([decode_frame(strip_size(r)) for r in raws])
    assert dec.buffered == 0


def test_frame_decoder_byte_by_byte() -> None:
    raws = _sample_frames()
    stream = b"".join(raws)
    expected = _summary([decode_frame(strip_size(r)) for r in raws])
    dec = FrameDecoder()
    got = []
    boundaries = set()
    pos = 0
    for r in raws:
        pos += len(r)
        boundaries.add(pos)
    for i in range(len(stream)):
        frames = dec.feed(stream[i : i + 1])
        # A frame completes exactly when its last byte arrives.
        assert len(frames) == (1 if (i + 1) in boundaries else 0)
        got.extend(frames)
    assert _summary(got) == expected
    assert dec.buffered == 0


@pytest.mark.parametrize("seed", range(20))
def test_frame_decoder_random_chunks(seed: int) -> None:
    rng = random.Random(seed)
    raws = _sample_frames()
    stream = b"".join(raws)
    expected = _summary([decode_frame(strip_size(r)) for r in raws])
    dec = FrameDecoder()
    got = []
    pos = 0
    while pos < len(stream):
        n = rng.randint(0, 300)
        got.extend(dec.feed(stream[pos : pos + n]))
        pos += n
    assert _summary(got) == expected
    assert dec.buffered == 0


def test_frame_decoder_partial_frame_is_buffered() -> None:
    raw = encode_command(ping())
    dec = FrameDecoder()
    assert dec.feed(raw[:-1]) == []
    assert dec.buffered == len(raw) - 1
    frames = dec.feed(raw[-1:] + raw[:3])
    assert len(frames) == 1
    assert frames[0].command == ping()
    assert dec.buffered == 3


def test_frame_decoder_default_limit() -> None:
    assert FrameDecoder().max_frame_size == DEFAULT_MAX_MESSAGE_SIZE + FRAME_HEADROOM == 5 * 1024 * 1024 + 10 * 1024


def test_frame_decoder_rejects_oversized_frame_from_header_alone() -> None:
    dec = FrameDecoder(max_frame_size=100)
    with pytest.raises(ProtocolError, match="frame of 101 bytes exceeds the limit of 100"):
        dec.feed(U32.pack(101))  # the header alone is enough, no need to buffer the body


def test_frame_decoder_accepts_frame_at_limit() -> None:
    payload = b"z" * 50
    raw = encode_payload_frame(send_cmd(), metadata(), payload)
    dec = FrameDecoder(max_frame_size=len(raw) - 4)
    (frame,) = dec.feed(raw)
    assert frame.payload == payload
    dec = FrameDecoder(max_frame_size=len(raw) - 5)
    with pytest.raises(ProtocolError):
        dec.feed(raw)


def test_frame_decoder_default_limit_rejects_huge_size() -> None:
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(U32.pack(DEFAULT_MAX_MESSAGE_SIZE + FRAME_HEADROOM + 1))
    with pytest.raises(ProtocolError):
        FrameDecoder().feed(b"\xff\xff\xff\xff")


@pytest.mark.parametrize("size", [0, 1, 2, 3])
def test_frame_decoder_rejects_tiny_frame_size(size: int) -> None:
    with pytest.raises(ProtocolError, match=f"frame size {size} is too small"):
        FrameDecoder().feed(U32.pack(size) + b"\x00" * 8)


# ------------------------------------------------------------------ batches


def _batch_entries() -> list[tuple[pb.SingleMessageMetadata, bytes]]:
    entries = []
    for i, payload in enumerate([b"first", b"", b"\x00\xff" * 100, "ünïcødé".encode()]):
        smm = pb.SingleMessageMetadata(payload_size=len(payload), event_time=1_000 + i, sequence_id=i)
        smm.properties.add(key=f"k{i}", value=f"v{i}")
        smm.properties.add(key="shared", value="yes")
        if i % 2 == 0:
            smm.partition_key = f"key-{i}"
            smm.ordering_key = f"ord-{i}".encode()
        entries.append((smm, payload))
    return entries


def test_batch_round_trip() -> None:
    entries = _batch_entries()
    data = b"".join(encode_entry(smm, payload) for smm, payload in entries)
    out = decode_batch(data, len(entries))
    assert len(out) == 4
    for (smm_in, p_in), (smm_out, p_out) in zip(entries, out, strict=True):
        assert smm_out == smm_in
        assert p_out == p_in
    assert [p for _, p in out] == [b"first", b"", b"\x00\xff" * 100, "ünïcødé".encode()]
    assert [s.event_time for s, _ in out] == [1000, 1001, 1002, 1003]
    assert [s.partition_key for s, _ in out] == ["key-0", "", "key-2", ""]
    assert [s.HasField("partition_key") for s, _ in out] == [True, False, True, False]
    assert [s.ordering_key for s, _ in out] == [b"ord-0", b"", b"ord-2", b""]
    assert [{kv.key: kv.value for kv in s.properties} for s, _ in out] == [
        {"k0": "v0", "shared": "yes"},
        {"k1": "v1", "shared": "yes"},
        {"k2": "v2", "shared": "yes"},
        {"k3": "v3", "shared": "yes"},
    ]


def test_encode_entry_exact_bytes() -> None:
    smm = pb.SingleMessageMetadata(payload_size=2)
    # payload_size is field 3 (varint): 18 02
    assert encode_entry(smm, b"hi") == b"\x00\x00\x00\x02\x18\x02hi"


def test_decode_batch_zero_count() -> None:
    assert decode_batch(b"", 0) == []


def test_decode_batch_truncated_raises() -> None:
    entries = _batch_entries()
    data = b"".join(encode_entry(smm, payload) for smm, payload in entries)
    # Every proper prefix that cuts into some message must fail for the full count.
    for cut in range(len(data)):
        with pytest.raises(ProtocolError):
            decode_batch(data[:cut], len(entries))


def test_decode_batch_count_larger_than_data_raises() -> None:
    smm = pb.SingleMessageMetadata(payload_size=1)
    data = encode_entry(smm, b"a")
    assert len(decode_batch(data, 1)) == 1
    with pytest.raises(ProtocolError, match="batch truncated at message 1 of 2"):
        decode_batch(data, 2)


def test_decode_batch_negative_count_raises() -> None:
    with pytest.raises(ProtocolError, match="negative batch size -1"):
        decode_batch(b"", -1)


def test_decode_batch_bad_entries_raise() -> None:
    # metadata size overruns the payload
    with pytest.raises(ProtocolError, match="metadata overruns"):
        decode_batch(U32.pack(50) + b"\x18\x01", 1)
    # undecodable metadata
    with pytest.raises(ProtocolError, match="undecodable batch message 0"):
        decode_batch(U32.pack(2) + b"\xff\xff", 1)
    # payload_size missing (required)
    with pytest.raises(ProtocolError, match="missing required fields"):
        decode_batch(U32.pack(2) + b"\x28\x01", 1)
    # negative payload_size
    smm = pb.SingleMessageMetadata(payload_size=-1)
    with pytest.raises(ProtocolError, match="payload overruns"):
        decode_batch(encode_entry(smm, b""), 1)
    # payload_size larger than what is left
    smm = pb.SingleMessageMetadata(payload_size=10)
    with pytest.raises(ProtocolError, match="payload overruns"):
        decode_batch(encode_entry(smm, b"short"), 1)


# -------------------------------------------------------------- compression

CODECS = list(CompressionType)
SAMPLES = {
    "empty": b"",
    "one": b"a",
    "text": b"hello hello hello hello pulsar " * 50,
    "1mb-random": random.Random(1).randbytes(1024 * 1024),
    "1mb-repetitive": (b"0123456789abcdef" * 65536),
}


def test_compression_type_wire_values() -> None:
    assert [(c.name, int(c)) for c in CompressionType] == [
        ("NONE", 0),
        ("LZ4", 1),
        ("ZLIB", 2),
        ("ZSTD", 3),
        ("SNAPPY", 4),
    ]
    assert [int(c) for c in CompressionType] == [pb.NONE, pb.LZ4, pb.ZLIB, pb.ZSTD, pb.SNAPPY]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
@pytest.mark.parametrize("name", list(SAMPLES))
def test_compression_round_trip(codec: CompressionType, name: str) -> None:
    data = SAMPLES[name]
    packed = compress(codec, data)
    assert isinstance(packed, bytes)
    if codec == CompressionType.NONE:
        assert packed == data
    elif name == "1mb-repetitive":
        assert len(packed) < len(data) // 10
    assert decompress(codec, packed, len(data)) == data
    assert decompress(int(codec), packed, len(data)) == data


def test_compression_interop_formats() -> None:
    # ZLIB is a plain zlib stream; SNAPPY and LZ4 are raw blocks with no size prefix.
    data = b"abcabcabcabc" * 10
    assert zlib.decompress(compress(CompressionType.ZLIB, data)) == data
    assert compress(CompressionType.SNAPPY, b"")[:1] == b"\x00"  # varint length 0
    snappy = compress(CompressionType.SNAPPY, data)
    assert snappy[0] == len(data)  # raw snappy starts with the varint length (120 < 128)


@pytest.mark.parametrize("codec", [c for c in CODECS if c != CompressionType.NONE], ids=lambda c: c.name)
def test_decompress_wrong_size_raises(codec: CompressionType) -> None:
    data = b"some payload that compresses " * 20
    packed = compress(codec, data)
    for wrong in (len(data) - 1, len(data) + 1, 1):
        with pytest.raises(ProtocolError):
            decompress(codec, packed, wrong)


def test_decompress_none_ignores_declared_size() -> None:
    # NONE is passed through as is; uncompressed_size is not checked for it.
    assert decompress(CompressionType.NONE, b"abc", 99) == b"abc"


@pytest.mark.parametrize("codec", [c for c in CODECS if c != CompressionType.NONE], ids=lambda c: c.name)
@pytest.mark.parametrize("garbage", [b"\xff" * 16, b"garbage garbage garbage", bytes(range(7, 200, 3)), b"\x0f"])
def test_decompress_garbage_raises(codec: CompressionType, garbage: bytes) -> None:
    with pytest.raises(ProtocolError):
        decompress(codec, garbage, 100)


@pytest.mark.parametrize("codec", [99, -1, 5])
def test_decompress_unknown_codec_raises(codec: int) -> None:
    with pytest.raises(ProtocolError, match=f"unknown compression type {codec}"):
        decompress(codec, b"x", 1)


def test_compress_unknown_codec_raises_value_error() -> None:
    with pytest.raises(ValueError):
        compress(99, b"x")  # type: ignore[arg-type]


def test_decompress_zlib_bomb_is_bounded() -> None:
    bomb = zlib.compress(b"\0" * (32 * 1024 * 1024), 9)  # ~32 KiB on the wire
    assert len(bomb) < 100_000
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError):
            decompress(CompressionType.ZLIB, bomb, 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024


# ------------------------------------------------------------------ crc32c


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0x00000000),
        (b"a", 0xC1D04330),
        (b"123456789", 0xE3069283),
        (b"\x00" * 32, 0x8A9136AA),  # RFC 3720 B.4
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
    ],
)
def test_crc32c_known_vectors(data: bytes, expected: int) -> None:
    assert crc32c(data) == expected
    assert crc32c(memoryview(data)) == expected
    assert crc32c(memoryview(b"xx" + data + b"yy")[2 : 2 + len(data)]) == expected
    assert crc32c(memoryview(bytearray(data))) == expected


def test_crc32c_accepts_bytearray() -> None:
    assert crc32c(bytearray(b"123456789")) == 0xE3069283


# ------------------------------------------------------------------- topics


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("my-topic", ("persistent", "public", "default", "my-topic")),
        ("t/n/x", ("persistent", "t", "n", "x")),
        ("persistent://t/n/x", ("persistent", "t", "n", "x")),
        ("non-persistent://t/n/x", ("non-persistent", "t", "n", "x")),
        ("non-persistent://public/default/a.b_c=d:e-f", ("non-persistent", "public", "default", "a.b_c=d:e-f")),
        ("t/n/a%20b", ("persistent", "t", "n", "a%20b")),
    ],
)
def test_parse_topic_valid(name: str, parts: tuple[str, str, str, str]) -> None:
    t = parse_topic(name)
    assert (t.domain, t.tenant, t.namespace, t.local) == parts
    assert t == TopicName(*parts)
    assert str(t) == f"{parts[0]}://{parts[1]}/{parts[2]}/{parts[3]}"
    assert parse_topic(str(t)) == t


def test_parse_topic_short_name_string() -> None:
    assert str(parse_topic("my-topic")) == "persistent://public/default/my-topic"
    assert str(parse_topic("t/n/x")) == "persistent://t/n/x"


@pytest.mark.parametrize(
    ("name", "index", "base"),
    [
        ("persistent://t/n/x-partition-3", 3, "persistent://t/n/x"),
        ("x-partition-0", 0, "persistent://public/default/x"),
        ("persistent://t/n/x-partition-12", 12, "persistent://t/n/x"),
        ("persistent://t/n/x", -1, "persistent://t/n/x"),
        ("persistent://t/n/x-partition-", -1, "persistent://t/n/x-partition-"),
        ("persistent://t/n/x-partition-a", -1, "persistent://t/n/x-partition-a"),
        ("persistent://t/n/-partition-3", -1, "persistent://t/n/-partition-3"),
        ("persistent://t/n/x-partition-1-partition-2", 2, "persistent://t/n/x-partition-1"),
        ("non-persistent://t/n/y-partition-5", 5, "non-persistent://t/n/y"),
    ],
)
def test_topic_partitions(name: str, index: int, base: str) -> None:
    t = parse_topic(name)
    assert t.partition_index == index
    assert t.base == base


def test_topic_partition_name() -> None:
    t = parse_topic("persistent://t/n/x")
    assert t.partition(0) == "persistent://t/n/x-partition-0"
    assert t.partition(7) == "persistent://t/n/x-partition-7"
    p = parse_topic(t.partition(7))
    assert p.partition_index == 7
    assert p.base == str(t)


@pytest.mark.parametrize(
    "name",
    [
        "",
        " a",
        "a ",
        "a/b",
        "a/b/c/d",
        "http://a/b/c",
        "a b",
        "persistent://",
        "persistent://a/b",
        "persistent://a/b/",
        "a//c",
        "/b/c",
        "a/b c/d",
        "a/b/c d",
        "t/n/x\n",
        "te%nant/n/x",
        "t/n/x?y",
        "persistent:/t/n/x",
        None,
        5,
        b"t/n/x",
    ],
)
def test_parse_topic_invalid(name: object) -> None:
    with pytest.raises(InvalidTopicName) as info:
        parse_topic(name)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, PulsarError)
    assert info.value.topic == (name if isinstance(name, str) else str(name))


def test_invalid_topic_name_is_caught_as_value_error() -> None:
    with pytest.raises(ValueError):
        parse_topic("a/b")


@pytest.mark.parametrize("name", ["a\n/b/c", "a/b\n/c", "persistent://a\n/b/c"])
def test_parse_topic_rejects_newline_in_tenant_or_namespace(name: str) -> None:
    with pytest.raises(InvalidTopicName):
        parse_topic(name)


# ------------------------------------------------------------------- TxnID


def test_txnid_str_and_parse() -> None:
    tid = TxnID(1, 2)
    assert str(tid) == "(1,2)"
    assert TxnID.parse("(1,2)") == tid
    assert TxnID.parse(str(tid)) == tid
    assert TxnID.parse("1:2") == tid
    assert TxnID.parse("  (1, 2)  ") == tid
    assert TxnID.parse("( 1 ,2 )") == tid
    assert TxnID.parse(" 1:2 ") == tid
    big = TxnID(2**63, 2**64 - 1)
    assert str(big) == f"({2**63},{2**64 - 1})"
    assert TxnID.parse(str(big)) == big
    assert hash(TxnID(3, 4)) == hash(TxnID(3, 4))
    assert {TxnID(3, 4), TxnID(3, 4), TxnID(4, 3)} == {TxnID(3, 4), TxnID(4, 3)}


@pytest.mark.parametrize(
    "text",
    ["", "abc", "(1,2", "1,2)", "1,2", "(1;2)", "(-1,2)", "-1:2", "1:", ":2", "1:2:3", "(a,b)", "(1,2,3)", "()"],
)
def test_txnid_parse_garbage_raises(text: str) -> None:
    with pytest.raises(ValueError):
        TxnID.parse(text)


def test_txnid_is_frozen() -> None:
    tid = TxnID(1, 2)
    with pytest.raises(AttributeError):
        tid.most = 5  # type: ignore[misc]


# ---------------------------------------------------------------- MessageId


def test_message_id_ordering() -> None:
    ids = [
        MessageId(ledger_id=2, entry_id=0),
        MessageId(ledger_id=1, entry_id=3),
        MessageId(ledger_id=1, entry_id=2, partition=1),
        MessageId(ledger_id=1, entry_id=2, partition=0, batch_index=5),
        MessageId(ledger_id=1, entry_id=2, partition=0, batch_index=1),
        MessageId(ledger_id=1, entry_id=2),
        MessageId(ledger_id=0, entry_id=99),
    ]
    assert sorted(ids) == [
        MessageId(ledger_id=0, entry_id=99),
        MessageId(ledger_id=1, entry_id=2),
        MessageId(ledger_id=1, entry_id=2, partition=1),  # batch index before partition, as in the official order
        MessageId(ledger_id=1, entry_id=2, partition=0, batch_index=1),
        MessageId(ledger_id=1, entry_id=2, partition=0, batch_index=5),
        MessageId(ledger_id=1, entry_id=3),
        MessageId(ledger_id=2, entry_id=0),
    ]
    assert MessageId(ledger_id=1, entry_id=2) < MessageId(ledger_id=1, entry_id=3)
    assert MessageId(ledger_id=1, entry_id=3) > MessageId(ledger_id=1, entry_id=2)
    assert MessageId(ledger_id=1, entry_id=2) <= MessageId(ledger_id=1, entry_id=2)
    assert MessageId(ledger_id=1, entry_id=2) >= MessageId(ledger_id=1, entry_id=2)
    assert not MessageId(ledger_id=1, entry_id=2) < MessageId(ledger_id=1, entry_id=2)
    assert max(ids) == MessageId(ledger_id=2, entry_id=0)


def test_message_id_equality_ignores_topic_and_batch_size() -> None:
    a = MessageId(ledger_id=1, entry_id=2, partition=3, batch_index=4, batch_size=10, topic="persistent://t/n/a")
    b = MessageId(ledger_id=1, entry_id=2, partition=3, batch_index=4, topic="persistent://t/n/b")
    assert a == b
    assert hash(a) == hash(b)
    assert len({a, b}) == 1
    assert MessageId(3, 1, 2, 4) != MessageId(3, 1, 2, 5)
    assert MessageId(ledger_id=1, entry_id=2) != "(1,2,-1,-1)"
    assert (MessageId(ledger_id=1, entry_id=2) == object()) is False
    with pytest.raises(TypeError):
        _ = MessageId(ledger_id=1, entry_id=2) < (1, 2)  # type: ignore[operator]


def test_message_id_hash_consistent() -> None:
    d = {MessageId(ledger_id=5, entry_id=6): "x"}
    assert d[MessageId(ledger_id=5, entry_id=6)] == "x"
    assert d.get(MessageId(ledger_id=5, entry_id=6, partition=0)) is None
    assert hash(MessageId(ledger_id=5, entry_id=6)) == hash(MessageId(-1, 5, 6, -1))


def test_message_id_str() -> None:
    assert str(MessageId(ledger_id=1, entry_id=2)) == "(1,2,-1,-1)"
    assert str(MessageId(ledger_id=1, entry_id=2, partition=3, batch_index=4, batch_size=5)) == "(1,2,3,4)"


@pytest.mark.parametrize(
    "mid",
    [
        MessageId(ledger_id=0, entry_id=0),
        MessageId(ledger_id=1, entry_id=2),
        MessageId(ledger_id=1, entry_id=2, partition=3),
        MessageId(ledger_id=1, entry_id=2, partition=3, batch_index=4, batch_size=10),
        MessageId(ledger_id=1, entry_id=2, batch_index=0, batch_size=1),
        MessageId(2**31 - 1, 2**63 - 1, 2**63 - 1, 2**31 - 1, batch_size=2**31 - 1),
        MessageId(ledger_id=-1, entry_id=-1),
    ],
)
def test_message_id_serialize_round_trip(mid: MessageId) -> None:
    back = MessageId.deserialize(mid.serialize())
    assert back == mid
    assert (back.ledger_id(), back.entry_id(), back.partition(), back.batch_index(), back.batch_size) == (
        mid.ledger_id(),
        mid.entry_id(),
        mid.partition(),
        mid.batch_index(),
        mid.batch_size,
    )
    assert MessageId.from_pb(mid.to_pb()) == mid


def test_message_id_serialize_exact_bytes() -> None:
    # ledgerId field 1 = 5, entryId field 2 = 6; partition/batch_index omitted when -1
    assert MessageId(ledger_id=5, entry_id=6).serialize() == b"\x08\x05\x10\x06"
    assert MessageId(1, 5, 6, 2, batch_size=3).serialize() == b"\x08\x05\x10\x06\x18\x01\x20\x02\x30\x03"


def test_message_id_from_pb_overrides() -> None:
    d = pb.MessageIdData(ledgerId=9, entryId=8, partition=1)
    mid = MessageId.from_pb(d, partition=4, topic="persistent://t/n/x")
    assert (mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index(), mid.batch_size) == (9, 8, 4, -1, 0)
    assert mid.topic == "persistent://t/n/x"
    assert mid.entry_key == (9, 8, 4)


# ------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("AuthenticationError", errors.AuthenticationError),
        ("AuthorizationError", errors.AuthorizationError),
        ("ConsumerBusy", errors.ConsumerBusy),
        ("ServiceNotReady", errors.ServiceNotReady),
        ("TopicNotFound", errors.TopicNotFound),
        ("SubscriptionNotFound", errors.SubscriptionNotFound),
        ("TooManyRequests", errors.TooManyRequests),
        ("ProducerBusy", errors.ProducerBusy),
        ("InvalidTopicName", errors.InvalidTopicName),
        ("TransactionCoordinatorNotFound", errors.CoordinatorNotFound),
        ("InvalidTxnStatus", errors.InvalidTxnStatus),
        ("NotAllowedError", errors.NotAllowed),
        ("TransactionConflict", errors.TransactionConflict),
        ("TransactionNotFound", errors.TransactionNotFound),
        ("ProducerFenced", errors.ProducerFenced),
        ("UnknownError", errors.BrokerError),
        ("MetadataError", errors.BrokerMetadataError),
        ("PersistenceError", errors.BrokerPersistenceError),
        ("ChecksumError", errors.ChecksumError),
        ("TopicTerminatedError", errors.TopicTerminated),
        ("NoSuchError", errors.BrokerError),
    ],
)
def test_from_server_error_mapping(name: str, cls: type[PulsarError]) -> None:
    tid = TxnID(1, 2)
    exc = errors.from_server_error(name, "it broke", topic="persistent://t/n/x", txn_id=tid)
    assert type(exc) is cls
    assert isinstance(exc, PulsarError)
    assert exc.message == "it broke"
    assert exc.topic == "persistent://t/n/x"
    assert exc.txn_id is tid
    assert exc.server_error == name
    assert str(exc) == f"it broke | topic=persistent://t/n/x | txn=(1,2) | broker_error={name}"


def test_from_server_error_covers_every_wire_error() -> None:
    for name in pb.ServerError.keys():
        exc = errors.from_server_error(name, "m")
        assert isinstance(exc, PulsarError)
        assert exc.server_error == name


def test_from_server_error_empty_message_uses_name() -> None:
    exc = errors.from_server_error("TopicNotFound", "")
    assert exc.message == "TopicNotFound"
    assert exc.topic is None
    assert exc.txn_id is None
    assert str(exc) == "TopicNotFound | broker_error=TopicNotFound"


def test_error_classes_flags() -> None:
    assert errors.from_server_error("TransactionCoordinatorNotFound", "m").retriable is True
    assert errors.from_server_error("ServiceNotReady", "m").retriable is True
    assert errors.from_server_error("TopicNotFound", "m").retriable is False
    assert errors.from_server_error("TransactionConflict", "m").result is errors.Result.TransactionConflict
    assert isinstance(errors.from_server_error("TransactionNotFound", "m"), errors.TransactionError)
    assert isinstance(errors.from_server_error("InvalidTopicName", "m"), ValueError)
    assert issubclass(errors.TransactionTimedOut, errors.TransactionNotFound)
    assert issubclass(ProtocolError, PulsarError)
    assert errors.ConnectError("x").retriable is True
    assert str(PulsarError("plain")) == "plain"
