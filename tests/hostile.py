"""Hostile inputs for the client: payloads that lie about their size, raw sends that bypass our
producer's honesty, and a loopback fake broker for frames a real broker never sends.

The fake broker speaks just enough of the protocol for a client to connect, look a topic up,
subscribe and receive the entries it is given; everything else a test needs from a broker
comes from the real one.
"""

from __future__ import annotations

import asyncio
import resource
import struct
import time
from dataclasses import dataclass, field

import zstandard

from txn import AsyncClient, MessageId
from txn.connection import PROTOCOL_VERSION, check_error, command, next_request_id
from txn.protocol import CompressionType, decode_frame, encode_command, encode_payload_frame, pb

T = pb.BaseCommand
U32 = struct.Struct(">I")
MiB = 1024 * 1024


# ------------------------------------------------------------------ hostile payloads


def zstd_bomb(size: int, *, state_size: bool = True) -> bytes:
    """A ZSTD frame of ``size`` zero bytes, built in 1 MiB steps (the builder never holds ``size``)."""
    cctx = zstandard.ZstdCompressor(level=1, write_content_size=state_size)
    obj = cctx.compressobj(size=size if state_size else -1)
    chunk = bytes(MiB)
    parts = []
    left = size
    while left:
        n = min(left, MiB)
        parts.append(obj.compress(chunk[:n]))
        left -= n
    parts.append(obj.flush())
    return b"".join(parts)


def snappy_bomb(copies: int) -> bytes:
    """A raw Snappy block stating ``1 + 64 * copies`` bytes: one zero literal, then 64-byte back-copies."""
    n = 1 + 64 * copies
    prefix = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        prefix.append(b | (0x80 if n else 0))
        if not n:
            break
    # literal of length 1 (tag 0x00) holding 0x00; copy with a 2-byte offset: tag (64-1)<<2 | 2, offset 1
    return bytes(prefix) + b"\x00\x00" + b"\xfe\x01\x00" * copies


def peak_rss() -> int:
    """This process's peak resident set size in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ------------------------------------------------------------------------ raw send


async def send_raw(client: AsyncClient, topic: str, payload: bytes, *, codec: CompressionType = CompressionType.NONE,
                   uncompressed_size: int | None = None, batch: int | None = None) -> MessageId:
    """Store ``payload`` on the real broker as one entry with exactly the metadata given.

    The broker never decodes a payload, so this is how a message whose metadata or codec
    header lies reaches a consumer. Returns the entry's id.
    """
    conn = await client.context.pool.connection_for(topic)
    pid = client.context.next_id()
    rid = next_request_id()
    resp = await conn.request(command(T.PRODUCER, topic=topic, producer_id=pid, request_id=rid), rid)
    check_error(resp, "create raw producer", topic=topic)
    receipt: asyncio.Future[pb.CommandSendReceipt] = asyncio.get_running_loop().create_future()

    class Handler:
        def on_send_receipt(self, r: pb.CommandSendReceipt) -> None:
            if not receipt.done():
                receipt.set_result(r)

        def on_send_error(self, err: pb.CommandSendError) -> None:
            if not receipt.done():
                receipt.set_exception(RuntimeError(f"send error {err}"))

        def on_broker_close(self) -> None:
            pass

        def on_connection_closed(self, c: object, exc: BaseException) -> None:
            if not receipt.done():
                receipt.set_exception(exc)

    conn.producers[pid] = Handler()  # type: ignore[assignment]
    meta = pb.MessageMetadata(producer_name=resp.producer_success.producer_name, sequence_id=0,
                              publish_time=int(time.time() * 1000))
    if codec != CompressionType.NONE:
        meta.compression = int(codec)
        meta.uncompressed_size = len(payload) if uncompressed_size is None else uncompressed_size
    if batch is not None:
        meta.num_messages_in_batch = batch
    conn.write(encode_payload_frame(command(T.SEND, producer_id=pid, sequence_id=0, num_messages=batch or 1),
                                    meta, payload))
    try:
        r = await asyncio.wait_for(receipt, 30)
    finally:
        conn.producers.pop(pid, None)
        rid = next_request_id()
        await conn.request(command(T.CLOSE_PRODUCER, producer_id=pid, request_id=rid), rid)
    return MessageId(ledger_id=r.message_id.ledgerId, entry_id=r.message_id.entryId, topic=topic)


# ----------------------------------------------------------------- fake broker


@dataclass
class Entry:
    """One entry the fake broker dispatches: ``corrupt`` flips its CRC32C."""

    entry_id: int
    payload: bytes
    corrupt: bool = False
    batch: int | None = None
    ledger_id: int = 7


@dataclass
class FakeBroker:
    """A loopback broker for hostile frames (see the module docstring)."""

    entries: list[Entry] = field(default_factory=list)
    partitions: int = 0
    max_message_size: int | None = None
    acked: list[tuple[int, int]] = field(default_factory=list)
    port: int = 0
    _server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeBroker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (size,) = U32.unpack(await reader.readexactly(4))
                cmd = decode_frame(await reader.readexactly(size)).command
                for out in self.answer(cmd):
                    writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def answer(self, cmd: pb.BaseCommand) -> list[bytes]:
        """Frames to send back for ``cmd``."""
        t = cmd.type
        if t == T.CONNECT:
            c = pb.CommandConnected(server_version="fake-broker", protocol_version=PROTOCOL_VERSION)
            if self.max_message_size is not None:
                c.max_message_size = self.max_message_size
            return [encode_command(pb.BaseCommand(type=T.CONNECTED, connected=c))]
        if t == T.PARTITIONED_METADATA:
            r = pb.CommandPartitionedTopicMetadataResponse(request_id=cmd.partitionMetadata.request_id,
                                                           partitions=self.partitions)
            return [encode_command(pb.BaseCommand(type=T.PARTITIONED_METADATA_RESPONSE, partitionMetadataResponse=r))]
        if t == T.LOOKUP:
            r = pb.CommandLookupTopicResponse(request_id=cmd.lookupTopic.request_id, brokerServiceUrl=self.url,
                                              response=pb.CommandLookupTopicResponse.Connect, authoritative=True)
            return [encode_command(pb.BaseCommand(type=T.LOOKUP_RESPONSE, lookupTopicResponse=r))]
        if t in (T.SUBSCRIBE, T.CLOSE_CONSUMER, T.UNSUBSCRIBE):
            sub = {T.SUBSCRIBE: cmd.subscribe, T.CLOSE_CONSUMER: cmd.close_consumer, T.UNSUBSCRIBE: cmd.unsubscribe}[t]
            return [encode_command(pb.BaseCommand(type=T.SUCCESS, success=pb.CommandSuccess(
                request_id=sub.request_id)))]
        if t == T.FLOW and cmd.flow.messagePermits and self.entries:
            entries, self.entries = self.entries, []
            return [self._message(cmd.flow.consumer_id, e) for e in entries]
        if t == T.ACK:
            self.acked.extend((d.ledgerId, d.entryId) for d in cmd.ack.message_id)
        elif t == T.PING:
            return [encode_command(pb.BaseCommand(type=T.PONG, pong=pb.CommandPong()))]
        return []

    @staticmethod
    def _message(consumer_id: int, e: Entry) -> bytes:
        cmd = pb.BaseCommand(type=T.MESSAGE, message=pb.CommandMessage(
            consumer_id=consumer_id, message_id=pb.MessageIdData(ledgerId=e.ledger_id, entryId=e.entry_id)))
        meta = pb.MessageMetadata(producer_name="fake", sequence_id=e.entry_id, publish_time=1)
        if e.batch is not None:
            meta.num_messages_in_batch = e.batch
        frame = bytearray(encode_payload_frame(cmd, meta, e.payload))
        if e.corrupt:
            crc_at = 8 + len(cmd.SerializeToString()) + 2
            frame[crc_at] ^= 0xFF
        return bytes(frame)
