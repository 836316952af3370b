"""Service URLs, the connection pool, topic lookup and partition metadata."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlparse

from .auth import Authentication
from .backoff import Backoff
from .connection import MAX_MESSAGE_SIZE_CEILING, Connection, check_error, command, next_request_id
from .errors import ConnectError, InvalidUrl, PulsarError, Timeout, TooManyPartitions, from_server_error
from .protocol import pb

log = logging.getLogger("txn.pool")
T = pb.BaseCommand
MAX_REDIRECTS = 20
#: Default bound on a partition count the broker reports.
MAX_PARTITIONS = 65536


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """A broker's ``pulsar://`` or ``pulsar+ssl://`` URL split into parts."""

    url: str
    host: str
    port: int
    tls: bool


def parse_service_url(url: str) -> list[BrokerAddress]:
    """Parse ``pulsar://h1:6650,h2:6650`` (or ``pulsar+ssl://``) into addresses.

    A URL of another form raises :class:`~txn.errors.InvalidUrl` (a ``ValueError``, as the
    official client raises)."""
    if not isinstance(url, str):
        raise ValueError(f"service URL must be a string, got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("pulsar", "pulsar+ssl"):
        raise InvalidUrl(f"invalid service URL {url!r}: expected pulsar://host:port or pulsar+ssl://host:port")
    tls = scheme == "pulsar+ssl"
    out: list[BrokerAddress] = []
    for hostport in rest.rstrip("/").split(","):
        p = urlparse(f"{scheme}://{hostport}")
        if not p.hostname:
            raise InvalidUrl(f"invalid service URL {url!r}: no host in {hostport!r}")
        port = p.port or (6651 if tls else 6650)
        out.append(BrokerAddress(f"{scheme}://{p.hostname}:{port}", p.hostname, port, tls))
    return out


def client_certificate(auth: Authentication | None, certificate_path: str | None,
                       private_key_path: str | None) -> tuple[str, str] | None:
    """The ``(certificate, key)`` files to present in TLS handshakes: the client's own, else the
    ones of :class:`~txn.auth.AuthenticationTLS`. ``ValueError`` if only one file is given."""
    if (certificate_path is None) != (private_key_path is None):
        raise ValueError("tls_certificate_file_path and tls_private_key_file_path go together: give both or neither")
    if certificate_path is not None and private_key_path is not None:
        return certificate_path, private_key_path
    return auth.tls_client_files() if auth is not None else None


def load_client_certificate(ctx: ssl.SSLContext, certificate_path: str, private_key_path: str) -> None:
    """Load a client certificate and its key into ``ctx``; ``ValueError`` naming the files if they
    cannot be read or do not match."""
    try:
        ctx.load_cert_chain(certificate_path, private_key_path)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the TLS client certificate {certificate_path} with key {private_key_path}: "
                         f"{exc}") from None


class ConnectionPool:
    """One connection per broker URL, shared by producers, consumers and coordinators."""

    def __init__(
        self,
        service_url: str,
        *,
        auth: Authentication | None,
        operation_timeout: float,
        connection_timeout: float,
        keepalive_interval: float,
        tls_trust_certs_file_path: str | None = None,
        tls_allow_insecure_connection: bool = False,
        tls_validate_hostname: bool = False,
        tls_certificate_file_path: str | None = None,
        tls_private_key_file_path: str | None = None,
        max_partitions: int = MAX_PARTITIONS,
        max_message_size_ceiling: int = MAX_MESSAGE_SIZE_CEILING,
        max_uncompressed_message_size: int | None = None,
    ) -> None:
        self.max_partitions = max_partitions
        self.max_message_size_ceiling = max_message_size_ceiling
        #: Bound on a decompressed entry; ``None``: the connection's ``max_message_size``.
        self.max_uncompressed_message_size = max_uncompressed_message_size
        self.operation_timeout = operation_timeout
        self.connection_timeout = connection_timeout
        self.keepalive_interval = keepalive_interval
        self._tls_options = (tls_allow_insecure_connection, tls_validate_hostname, tls_certificate_file_path,
                             tls_private_key_file_path)
        #: Incremented by each :meth:`switch_service` (a connection opened across one is dropped).
        self.cluster_epoch = 0
        self._configure(service_url, auth, tls_trust_certs_file_path)
        self._conns: dict[tuple[str, str], asyncio.Future[Connection]] = {}
        self._rr = 0
        self.closed = False
        #: LOOKUP commands sent, how many the broker answered with a redirect, and how many lookups
        #: ended at another broker than the one first asked (diagnostics, tests).
        self.lookups = 0
        self.lookup_redirects = 0
        self.lookups_elsewhere = 0

    def _configure(self, service_url: str, auth: Authentication | None, tls_trust_certs_file_path: str | None) -> None:
        """Set the service URL and the credentials and TLS settings of the cluster it names."""
        allow_insecure, validate_hostname, cert_path, key_path = self._tls_options
        addresses = parse_service_url(service_url)
        ctx: ssl.SSLContext | None = None
        if auth is not None:
            auth.configure_client_tls(tls_trust_certs_file_path, allow_insecure)
        client_cert = client_certificate(auth, cert_path, key_path)
        if addresses[0].tls:
            ctx = ssl.create_default_context(cafile=tls_trust_certs_file_path)
            ctx.check_hostname = validate_hostname and not allow_insecure
            if allow_insecure:
                ctx.verify_mode = ssl.CERT_NONE
            if client_cert is not None:
                load_client_certificate(ctx, *client_cert)
        self.service_addresses = addresses
        self.service_url = service_url
        self.auth = auth
        self.use_tls = addresses[0].tls
        self._ssl = ctx

    def switch_service(self, service_url: str, auth: Authentication | None,
                       tls_trust_certs_file_path: str | None) -> None:
        """Move to another cluster (cluster failover): later connections go to ``service_url`` with
        ``auth`` and the trust file; every current connection is closed, so producers, consumers
        and readers reconnect there."""
        self._configure(service_url, auth, tls_trust_certs_file_path)
        self.cluster_epoch += 1
        conns = list(self._conns.values())
        self._conns.clear()
        for fut in conns:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                fut.result().close(ConnectError(f"the client switched to cluster {service_url}"))

    # ------------------------------------------------------------- connections

    async def get(self, logical_url: str | None = None, physical_url: str | None = None) -> Connection:
        """A ready connection to ``logical_url`` (default: the service URL), reached via ``physical_url``."""
        if self.closed:
            raise ConnectError("client is closed")
        if logical_url is None:
            addr = self.service_addresses[self._rr % len(self.service_addresses)]
            self._rr += 1
            logical_url = addr.url
        physical_url = physical_url or logical_url
        key = (logical_url, physical_url)
        fut = self._conns.get(key)
        if fut is not None:
            if not fut.done():
                return await asyncio.shield(fut)
            if fut.exception() is None and not fut.result().closed:
                return fut.result()
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._conns[key] = fut
        epoch = self.cluster_epoch
        try:
            conn = await self._open(logical_url, physical_url)
            if self.cluster_epoch != epoch:
                conn.close()
                raise ConnectError(f"the client switched to cluster {self.service_url} while connecting to "
                                   f"{physical_url}")
        except BaseException as exc:
            if self._conns.get(key) is fut:
                self._conns.pop(key, None)
            if not fut.done():
                # Callers waiting on this attempt get a PulsarError even when the task that made
                # it was cancelled: a CancelledError handed to them would end their own retry loops
                # (a producer's reconnect task, say) as if they had been cancelled themselves.
                err = exc if isinstance(exc, PulsarError) else ConnectError(
                    f"connecting to {physical_url} failed: {type(exc).__name__}: {exc}")
                fut.set_exception(err)
                fut.exception()  # mark retrieved
            raise
        fut.set_result(conn)
        conn.close_listeners.append(lambda c, _e, k=key: self._forget(k, c))
        return conn

    def _forget(self, key: tuple[str, str], conn: Connection) -> None:
        fut = self._conns.get(key)
        if fut is not None and fut.done() and fut.exception() is None and fut.result() is conn:
            del self._conns[key]

    async def _open(self, logical_url: str, physical_url: str) -> Connection:
        (phys,) = parse_service_url(physical_url)[:1]
        conn = Connection(
            phys.host,
            phys.port,
            tls=self._ssl if phys.tls else None,
            server_hostname=phys.host,
            auth=self.auth,
            proxy_to_broker_url=(logical_url.split("://", 1)[1] if logical_url != physical_url else None),
            operation_timeout=self.connection_timeout,
            keepalive_interval=self.keepalive_interval,
            max_message_size_ceiling=self.max_message_size_ceiling,
        )
        await conn.open()
        conn.operation_timeout = self.operation_timeout
        log.debug("connected to %s (server %s)", conn.address, conn.server_version)
        return conn

    def connection_keys(self) -> list[tuple[str, str]]:
        """``(logical URL, physical URL)`` of each pooled (or connecting) connection."""
        return list(self._conns)

    def close(self) -> None:
        """Close every connection."""
        self.closed = True
        for fut in list(self._conns.values()):
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                fut.result().close()
        self._conns.clear()

    # ------------------------------------------------------------------ lookup

    async def retrying(self, what: str, op, *, topic: str | None = None, deadline: float | None = None):  # noqa: ANN001, ANN201
        """Run ``op()`` until it succeeds, retrying retriable errors until the operation timeout."""
        deadline = deadline or (time.monotonic() + self.operation_timeout)
        backoff = Backoff(0.1, 2.0)
        while True:
            try:
                return await op()
            except PulsarError as exc:
                if not exc.retriable or self.closed:
                    raise
                delay = backoff.next()
                if time.monotonic() + delay > deadline:
                    raise Timeout(f"{what} did not succeed in {self.operation_timeout:.0f}s; last error: {exc}",
                                  topic=topic) from exc
                log.debug("%s failed (%s); retrying in %.2fs", what, exc, delay)
                await asyncio.sleep(delay)

    async def lookup(self, topic: str) -> tuple[str, str]:
        """Find the broker owning ``topic``; returns ``(logical_url, physical_url)``."""
        return await self.retrying(f"lookup of {topic}", lambda: self._lookup_once(topic), topic=topic)

    async def _lookup_once(self, topic: str) -> tuple[str, str]:
        conn = await self.get()
        asked = conn_physical(conn)
        authoritative = False
        for _ in range(MAX_REDIRECTS):
            rid = next_request_id()
            self.lookups += 1
            resp = await conn.request(
                command(T.LOOKUP, topic=topic, request_id=rid, authoritative=authoritative), rid
            )
            check_error(resp, "lookup", topic=topic)
            r = resp.lookupTopicResponse
            if r.response == pb.CommandLookupTopicResponse.Failed:
                name = pb.ServerError.Name(r.error) if r.HasField("error") else "UnknownError"
                raise from_server_error(name, f"lookup failed: {r.message}", topic=topic)
            url = r.brokerServiceUrlTls if self.use_tls and r.brokerServiceUrlTls else r.brokerServiceUrl
            if not url:
                raise from_server_error("ServiceNotReady", "lookup returned no broker URL", topic=topic)
            if r.response == pb.CommandLookupTopicResponse.Redirect:
                authoritative = r.authoritative
                self.lookup_redirects += 1
                log.debug("lookup of %s: %s redirects to %s (authoritative=%s)", topic, conn.address, url,
                          authoritative)
                conn = await (self.get(url, conn_physical(conn)) if r.proxy_through_service_url else self.get(url))
                continue
            if url != asked:
                self.lookups_elsewhere += 1
            if r.proxy_through_service_url:
                return url, conn_physical(conn)
            return url, url
        raise from_server_error("ServiceNotReady", f"too many lookup redirects (> {MAX_REDIRECTS})", topic=topic)

    async def partitions(self, topic: str) -> int:
        """Number of partitions of ``topic`` (0 for a non-partitioned topic)."""

        async def once() -> int:
            conn = await self.get()
            rid = next_request_id()
            resp = await conn.request(command(T.PARTITIONED_METADATA, topic=topic, request_id=rid), rid)
            check_error(resp, "partition metadata", topic=topic)
            r = resp.partitionMetadataResponse
            if r.HasField("response") and r.response == pb.CommandPartitionedTopicMetadataResponse.Failed:
                name = pb.ServerError.Name(r.error) if r.HasField("error") else "UnknownError"
                raise from_server_error(name, f"partition metadata failed: {r.message}", topic=topic)
            if r.partitions > self.max_partitions:
                raise TooManyPartitions(
                    f"broker {conn.address} reports {r.partitions} partitions, more than max_partitions="
                    f"{self.max_partitions}", topic=topic)
            return r.partitions

        return await self.retrying(f"partition metadata of {topic}", once, topic=topic)

    async def connection_for(self, topic: str) -> Connection:
        """A connection to the broker that owns ``topic``."""
        logical, physical = await self.lookup(topic)
        return await self.get(logical, physical)


def conn_physical(conn: Connection) -> str:
    """The URL a connection physically reaches."""
    scheme = "pulsar+ssl" if conn.uses_tls else "pulsar"
    return f"{scheme}://{conn.host}:{conn.port}"
