"""One TCP (or TLS) connection to one broker: handshake, requests, keep-alive, dispatch."""

from __future__ import annotations

import asyncio
import itertools
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any, Protocol

from .auth import Authentication
from .errors import (
    AuthenticationError,
    ConnectError,
    ProtocolError,
    PulsarError,
    Timeout,
    from_server_error,
)
from .protocol import Frame, FrameDecoder, encode_command, pb
from .protocol.frames import DEFAULT_MAX_MESSAGE_SIZE, FRAME_HEADROOM
from .version import __version__

log = logging.getLogger("txn.connection")

PROTOCOL_VERSION = 21
#: Upper bound on the ``max_message_size`` a broker may announce (and so on one frame).
MAX_MESSAGE_SIZE_CEILING = 100 * 1024 * 1024
T = pb.BaseCommand

# Response command type -> (BaseCommand field, has request_id) used to match requests.
_RESPONSES: dict[int, str] = {
    T.SUCCESS: "success",
    T.ERROR: "error",
    T.PRODUCER_SUCCESS: "producer_success",
    T.PARTITIONED_METADATA_RESPONSE: "partitionMetadataResponse",
    T.LOOKUP_RESPONSE: "lookupTopicResponse",
    T.GET_LAST_MESSAGE_ID_RESPONSE: "getLastMessageIdResponse",
    T.ACK_RESPONSE: "ackResponse",
    T.NEW_TXN_RESPONSE: "newTxnResponse",
    T.ADD_PARTITION_TO_TXN_RESPONSE: "addPartitionToTxnResponse",
    T.ADD_SUBSCRIPTION_TO_TXN_RESPONSE: "addSubscriptionToTxnResponse",
    T.END_TXN_RESPONSE: "endTxnResponse",
    T.END_TXN_ON_PARTITION_RESPONSE: "endTxnOnPartitionResponse",
    T.TC_CLIENT_CONNECT_RESPONSE: "tcClientConnectResponse",
    T.GET_SCHEMA_RESPONSE: "getSchemaResponse",
    T.GET_TOPICS_OF_NAMESPACE_RESPONSE: "getTopicsOfNamespaceResponse",
}

# Field of the command type used when *sending* it.
_FIELD_FOR_TYPE: dict[int, str] = {
    T.CONNECT: "connect",
    T.SUBSCRIBE: "subscribe",
    T.PRODUCER: "producer",
    T.SEND: "send",
    T.ACK: "ack",
    T.FLOW: "flow",
    T.UNSUBSCRIBE: "unsubscribe",
    T.CLOSE_PRODUCER: "close_producer",
    T.CLOSE_CONSUMER: "close_consumer",
    T.PING: "ping",
    T.PONG: "pong",
    T.REDELIVER_UNACKNOWLEDGED_MESSAGES: "redeliverUnacknowledgedMessages",
    T.PARTITIONED_METADATA: "partitionMetadata",
    T.LOOKUP: "lookupTopic",
    T.SEEK: "seek",
    T.GET_LAST_MESSAGE_ID: "getLastMessageId",
    T.AUTH_RESPONSE: "authResponse",
    T.NEW_TXN: "newTxn",
    T.ADD_PARTITION_TO_TXN: "addPartitionToTxn",
    T.ADD_SUBSCRIPTION_TO_TXN: "addSubscriptionToTxn",
    T.END_TXN: "endTxn",
    T.END_TXN_ON_PARTITION: "endTxnOnPartition",
    T.TC_CLIENT_CONNECT_REQUEST: "tcClientConnectRequest",
    T.GET_SCHEMA: "getSchema",
    T.GET_TOPICS_OF_NAMESPACE: "getTopicsOfNamespace",
}

_request_ids = itertools.count(1)


def next_request_id() -> int:
    """A process-wide unique request id."""
    return next(_request_ids)


def command(kind: int, **fields: Any) -> pb.BaseCommand:
    """Build a ``BaseCommand`` of ``kind`` whose sub-message gets ``fields``."""
    cmd = pb.BaseCommand(type=kind)
    sub = getattr(cmd, _FIELD_FOR_TYPE[kind])
    sub.SetInParent()
    for k, v in fields.items():
        if v is None:
            continue
        attr = getattr(sub, k)
        if hasattr(attr, "CopyFrom") and not isinstance(v, (str, bytes, int, float, bool)):
            attr.CopyFrom(v)
        elif isinstance(v, (list, tuple)):
            attr.extend(v)
        else:
            setattr(sub, k, v)
    return cmd


class ProducerHandler(Protocol):
    def on_send_receipt(self, receipt: pb.CommandSendReceipt) -> None: ...
    def on_send_error(self, err: pb.CommandSendError) -> None: ...
    def on_broker_close(self) -> None: ...
    def on_connection_closed(self, conn: Connection, exc: BaseException) -> None: ...


class ConsumerHandler(Protocol):
    def on_message(self, cmd: pb.CommandMessage, frame: Frame) -> None: ...
    def on_broker_close(self) -> None: ...
    def on_active_change(self, active: bool) -> None: ...
    def on_end_of_topic(self) -> None: ...
    def on_connection_closed(self, conn: Connection, exc: BaseException) -> None: ...


class Connection(asyncio.Protocol):
    """A connection to one broker. Use :meth:`open` to create one."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        auth: Authentication | None = None,
        proxy_to_broker_url: str | None = None,
        operation_timeout: float = 30.0,
        keepalive_interval: float = 30.0,
        max_message_size_ceiling: int = MAX_MESSAGE_SIZE_CEILING,
    ) -> None:
        self.host = host
        self.port = port
        self.address = f"{host}:{port}"
        self._tls = tls
        self._server_hostname = server_hostname
        self._auth = auth
        self._proxy_to = proxy_to_broker_url
        self.operation_timeout = operation_timeout
        self.keepalive_interval = keepalive_interval
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder()
        self._pending: dict[int, asyncio.Future[pb.BaseCommand]] = {}
        self._connected: asyncio.Future[pb.CommandConnected] | None = None
        self.producers: dict[int, ProducerHandler] = {}
        self.consumers: dict[int, ConsumerHandler] = {}
        self.close_listeners: list[Callable[[Connection, BaseException], None]] = []
        self.closed = False
        self.close_reason: BaseException | None = None
        self.server_version = ""
        self.protocol_version = 0
        self.max_message_size = DEFAULT_MAX_MESSAGE_SIZE
        self.max_message_size_ceiling = max_message_size_ceiling
        self._last_received = time.monotonic()
        self._keepalive: asyncio.Task[None] | None = None
        self._write_paused: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The credentials this connection last presented (CONNECT or AUTH_RESPONSE).
        self._auth_sent: bytes | None = None
        self._challenge_task: asyncio.Task[None] | None = None
        #: AUTH_CHALLENGEs answered (diagnostics and tests).
        self.auth_challenges = 0

    # ------------------------------------------------------------------ opening

    async def open(self) -> Connection:
        """Connect and complete the Pulsar handshake."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._connected = loop.create_future()
        # Credentials first: an OAuth2 token may need an HTTP round trip to the issuer, and a
        # failure there (AuthenticationError) should not leave a half-open connection behind.
        auth_data = await self._auth.auth_data_async() if self._auth is not None else b""
        try:
            await asyncio.wait_for(
                loop.create_connection(
                    lambda: self,
                    self.host,
                    self.port,
                    ssl=self._tls,
                    server_hostname=self._server_hostname if self._tls else None,
                ),
                timeout=self.operation_timeout,
            )
        except ssl.SSLCertVerificationError as exc:
            # Retrying cannot help: fail now instead of retrying until the operation timeout.
            err = ConnectError(f"cannot connect to {self.address}: TLS certificate not trusted: {exc!r}")
            err.retriable = False
            raise err from exc
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            raise ConnectError(f"cannot connect to {self.address}: {exc!r}") from exc
        connect_fields: dict[str, Any] = {
            "client_version": f"txn-python-{__version__}",
            "protocol_version": PROTOCOL_VERSION,
            "feature_flags": pb.FeatureFlags(supports_auth_refresh=True),
        }
        if self._auth is not None:
            connect_fields["auth_method_name"] = self._auth.method_name
            connect_fields["auth_data"] = auth_data
            self._auth_sent = auth_data
        if self._proxy_to:
            connect_fields["proxy_to_broker_url"] = self._proxy_to
        self._write(encode_command(command(T.CONNECT, **connect_fields)))
        try:
            connected = await asyncio.wait_for(asyncio.shield(self._connected), self.operation_timeout)
        except TimeoutError as exc:
            self.close(Timeout(f"handshake with {self.address} timed out"))
            raise Timeout(f"handshake with {self.address} timed out") from exc
        except PulsarError:
            self.close()
            raise
        self.server_version = connected.server_version
        self.protocol_version = connected.protocol_version
        if connected.HasField("max_message_size"):
            self._set_max_message_size(connected.max_message_size)
        self._keepalive = loop.create_task(self._keepalive_loop())
        return self

    @property
    def uses_tls(self) -> bool:
        """True for a TLS connection (``pulsar+ssl``)."""
        return self._tls is not None

    @property
    def decoder(self) -> FrameDecoder:
        """The frame decoder of this connection (its ``max_frame_size`` and ``buffered`` bytes)."""
        return self._decoder

    def pending_request_count(self) -> int:
        """Requests sent and still awaiting the broker's answer."""
        return len(self._pending)

    def _set_max_message_size(self, announced: int) -> None:
        """Adopt the broker's ``max_message_size``, bounded by ``max_message_size_ceiling``.

        It sets the frame limit, i.e. how much a peer can make us buffer for one frame, so a
        value above the ceiling is clamped and a non-positive one ignored.
        """
        size = announced
        if size <= 0:
            log.warning("%s announced max_message_size %d; keeping %d", self.address, size, self.max_message_size)
            return
        if size > self.max_message_size_ceiling:
            log.warning("%s announced max_message_size %d; clamped to the client's ceiling of %d bytes",
                        self.address, size, self.max_message_size_ceiling)
            size = self.max_message_size_ceiling
        self.max_message_size = size
        self._decoder.max_frame_size = size + FRAME_HEADROOM

    # ------------------------------------------------------------ asyncio hooks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            import socket

            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data: bytes) -> None:
        self._last_received = time.monotonic()
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as exc:
            log.error("malformed data from %s: %s; closing the connection", self.address, exc)
            self.close(exc)
            return
        for frame in frames:
            try:
                self._dispatch(frame)
            except ProtocolError as exc:
                log.error("bad command from %s: %s; closing the connection", self.address, exc)
                self.close(exc)
                return

    def connection_lost(self, exc: Exception | None) -> None:
        reason = self.close_reason or ConnectError(
            f"connection to {self.address} lost" + (f": {exc!r}" if exc else "")
        )
        self._finish(reason)

    def pause_writing(self) -> None:
        if self._write_paused is None and self._loop is not None:
            self._write_paused = self._loop.create_future()

    def resume_writing(self) -> None:
        fut, self._write_paused = self._write_paused, None
        if fut is not None and not fut.done():
            fut.set_result(None)

    # ---------------------------------------------------------------- dispatch

    def _dispatch(self, frame: Frame) -> None:
        cmd = frame.command
        t = cmd.type
        if t == T.MESSAGE:
            m = cmd.message
            handler = self.consumers.get(m.consumer_id)
            if handler is not None:
                handler.on_message(m, frame)
            return
        if t == T.SEND_RECEIPT:
            p = self.producers.get(cmd.send_receipt.producer_id)
            if p is not None:
                p.on_send_receipt(cmd.send_receipt)
            return
        if t == T.SEND_ERROR:
            p = self.producers.get(cmd.send_error.producer_id)
            if p is not None:
                p.on_send_error(cmd.send_error)
            return
        field = _RESPONSES.get(t)
        if field is not None:
            sub = getattr(cmd, field)
            rid = sub.request_id
            fut = self._pending.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result(cmd)
            elif t == T.ERROR and self._connected is not None and not self._connected.done():
                self._connected.set_exception(self._handshake_error(cmd.error))
            return
        if t == T.CONNECTED:
            if self._connected is not None and not self._connected.done():
                self._connected.set_result(cmd.connected)
        elif t == T.PING:
            self._write(encode_command(command(T.PONG)))
        elif t == T.PONG:
            pass
        elif t == T.CLOSE_PRODUCER:
            p = self.producers.pop(cmd.close_producer.producer_id, None)
            if p is not None:
                p.on_broker_close()
        elif t == T.CLOSE_CONSUMER:
            c = self.consumers.pop(cmd.close_consumer.consumer_id, None)
            if c is not None:
                c.on_broker_close()
        elif t == T.ACTIVE_CONSUMER_CHANGE:
            c = self.consumers.get(cmd.active_consumer_change.consumer_id)
            if c is not None:
                c.on_active_change(cmd.active_consumer_change.is_active)
        elif t == T.REACHED_END_OF_TOPIC:
            c = self.consumers.get(cmd.reachedEndOfTopic.consumer_id)
            if c is not None:
                c.on_end_of_topic()
        elif t == T.AUTH_CHALLENGE:
            self._challenge_task = asyncio.get_running_loop().create_task(self._answer_challenge())
        else:
            log.debug("ignoring command %s from %s", pb.BaseCommand.Type.Name(t), self.address)

    def _handshake_error(self, err: pb.CommandError) -> PulsarError:
        name = pb.ServerError.Name(err.error)
        if name == "AuthenticationError":
            return AuthenticationError(
                f"broker {self.address} rejected authentication: {err.message}", server_error=name
            )
        return from_server_error(name, f"handshake with {self.address} failed: {err.message}")

    async def _answer_challenge(self) -> None:
        """Answer AUTH_CHALLENGE with fresh credentials.

        A broker challenges when the credentials of the connection have expired (token
        authentication checks every ``authenticationRefreshCheckSeconds``), so the provider is
        told what this connection sent: OAuth2 then fetches a new token unless it already holds a
        newer one. If no credentials can be had, the connection is closed with the error (the
        broker would close it anyway) and its users reconnect.
        """
        try:
            data = await self._auth.auth_data_async(stale=self._auth_sent) if self._auth else b""
        except Exception as exc:  # noqa: BLE001 - any provider failure ends this connection
            err = exc if isinstance(exc, PulsarError) else AuthenticationError(
                f"cannot answer the authentication challenge of {self.address}: {type(exc).__name__}: {exc}")
            log.warning("%s challenged our credentials and none could be had: %s; closing", self.address, err)
            self.close(err)
            return
        if self.closed:
            return
        self._auth_sent = data
        self.auth_challenges += 1
        method = self._auth.method_name if self._auth else "none"
        resp = pb.AuthData(auth_method_name=method, auth_data=data)
        self._write(
            encode_command(
                command(
                    T.AUTH_RESPONSE,
                    client_version=f"txn-python-{__version__}",
                    response=resp,
                    protocol_version=PROTOCOL_VERSION,
                )
            )
        )

    # ----------------------------------------------------------------- sending

    def _write(self, data: bytes) -> None:
        if self._transport is None or self.closed:
            raise ConnectError(f"connection to {self.address} is closed")
        self._transport.write(data)

    def write(self, data: bytes) -> None:
        """Queue raw frame bytes; raises :class:`ConnectError` if closed."""
        self._write(data)

    def send_command(self, cmd: pb.BaseCommand) -> None:
        """Send a command that expects no response."""
        self._write(encode_command(cmd))

    async def drain(self) -> None:
        """Wait until the socket's write buffer is below its high-water mark."""
        fut = self._write_paused
        if fut is not None:
            await fut

    async def request(
        self, cmd: pb.BaseCommand, request_id: int, timeout: float | None = None
    ) -> pb.BaseCommand:
        """Send ``cmd`` and await the response carrying ``request_id``.

        A ``CommandError`` response is returned as is (callers map it with context).
        Raises :class:`Timeout` or :class:`ConnectError`.
        """
        if self.closed:
            raise ConnectError(f"connection to {self.address} is closed")
        assert self._loop is not None
        fut: asyncio.Future[pb.BaseCommand] = self._loop.create_future()
        self._pending[request_id] = fut
        try:
            self._write(encode_command(cmd))
            return await asyncio.wait_for(fut, timeout if timeout is not None else self.operation_timeout)
        except TimeoutError as exc:
            name = pb.BaseCommand.Type.Name(cmd.type)
            raise Timeout(f"{name} to {self.address} got no response (request {request_id})") from exc
        finally:
            self._pending.pop(request_id, None)

    # --------------------------------------------------------------- keepalive

    async def _keepalive_loop(self) -> None:
        interval = self.keepalive_interval
        try:
            while not self.closed:
                await asyncio.sleep(interval)
                idle = time.monotonic() - self._last_received
                if idle >= 2 * interval:
                    self.close(ConnectError(f"no data from {self.address} for {idle:.0f}s; keep-alive failed"))
                    return
                if idle >= interval:
                    self._write(encode_command(command(T.PING)))
        except (ConnectError, asyncio.CancelledError):
            return

    # ------------------------------------------------------------------- close

    def close(self, reason: BaseException | None = None) -> None:
        """Close the socket; pending requests fail with ``reason`` (or ConnectError)."""
        if self.closed:
            return
        self.close_reason = reason or ConnectError(f"connection to {self.address} closed")
        if self._transport is not None:
            self._transport.close()
            if isinstance(reason, ProtocolError):
                self._transport.abort()
        self._finish(self.close_reason)

    def _finish(self, reason: BaseException) -> None:
        first = not self.closed
        self.closed = True
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._connected is not None and not self._connected.done():
            self._connected.set_exception(
                reason if isinstance(reason, PulsarError) else ConnectError(str(reason))
            )
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(
                    ConnectError(f"connection to {self.address} closed before the response: {reason}")
                )
        self._pending.clear()
        self.resume_writing()
        if not first:
            return
        for h in list(self.producers.values()):
            h.on_connection_closed(self, reason)
        for c in list(self.consumers.values()):
            c.on_connection_closed(self, reason)
        self.producers.clear()
        self.consumers.clear()
        for cb in list(self.close_listeners):
            try:
                cb(self, reason)
            except Exception:  # a listener bug must not break the others
                log.exception("close listener failed")


def check_error(resp: pb.BaseCommand, what: str, *, topic: str | None = None, txn_id: Any = None) -> None:
    """Raise the typed exception if ``resp`` is a ``CommandError``."""
    if resp.type == T.ERROR:
        name = pb.ServerError.Name(resp.error.error)
        raise from_server_error(name, f"{what} failed: {resp.error.message}", topic=topic, txn_id=txn_id)
