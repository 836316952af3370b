"""Cluster failover: ``ServiceInfo``, ``ServiceInfoProvider``, ``AutoClusterFailover`` (as the
official client's) and the runtime that switches a client's connection pool between clusters.

A client built on an :class:`AutoClusterFailover` probes the cluster it uses every
``check_interval_ms`` with a TCP connect to each host of its service URL (as the official C++
core does). After ``failover_threshold`` consecutive failed probes it switches to the first
secondary that answers; while on a secondary it probes the primary too and switches back after
``switch_back_threshold`` consecutive good probes. A :class:`ServiceInfoProvider` of one's own
switches the client by calling the update callback it got in ``initialize``.

A switch drops every connection; producers, consumers and readers reconnect to the new cluster
(each :class:`ServiceInfo` brings its own authentication and TLS trust file). A transaction
open during a switch stays on the old cluster: using it raises :class:`ClusterSwitched`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from .auth import Authentication
from .connection import Connection
from .coordinator import CoordinatorClient
from .errors import TransactionError
from .message import TxnID
from .transaction import AsyncTransaction, TxnState

log = logging.getLogger("txn.failover")

#: How long one TCP probe may take (the official C++ core's probe timeout).
PROBE_TIMEOUT_S = 30.0
_DEFAULT_PORTS = {"pulsar": 6650, "pulsar+ssl": 6651, "http": 80, "https": 443}


def _check(kind: type | tuple[type, ...], value: Any, name: str, *, none_ok: bool = False) -> None:
    """The official client's argument type check (``ValueError``, its wording)."""
    if none_ok and value is None:
        return
    if not isinstance(value, kind):
        if none_ok:
            raise ValueError(f"Argument {name} is expected to be either None or of type '{kind.__name__}'")
        raise ValueError(f"Argument {name} is expected to be of type '{kind.__name__}' and not "
                         f"'{type(value).__name__}'")


class ServiceInfo:
    """Connection information for one Pulsar cluster: its service URL, the authentication and the
    TLS trust file to use with it."""

    def __init__(self, service_url: str, authentication: Authentication | None = None,
                 tls_trust_certs_file_path: str | None = None) -> None:
        _check(str, service_url, "service_url")
        _check(Authentication, authentication, "authentication", none_ok=True)
        _check(str, tls_trust_certs_file_path, "tls_trust_certs_file_path", none_ok=True)
        if "://" not in service_url:
            raise ValueError(f"The scheme part is missing: {service_url}")
        self._service_url = service_url
        self._authentication = authentication
        self._trust = tls_trust_certs_file_path

    @property
    def service_url(self) -> str:
        """The cluster's service URL."""
        return self._service_url

    @property
    def use_tls(self) -> bool:
        """True for a ``pulsar+ssl://`` or ``https://`` URL."""
        return self._service_url.split("://", 1)[0] in ("pulsar+ssl", "https")

    @property
    def tls_trust_certs_file_path(self) -> str | None:
        """The CA file that verifies this cluster's certificates (``None``: the system's)."""
        return self._trust

    @property
    def authentication(self) -> Authentication | None:
        """The credentials presented to this cluster."""
        return self._authentication

    def hosts(self) -> list[tuple[str, int]]:
        """``(host, port)`` of each host of the service URL (empty if it names none)."""
        scheme, _, rest = self._service_url.partition("://")
        out = []
        for part in rest.split("/", 1)[0].split(","):
            try:
                p = urlparse(f"x://{part}")
                port = p.port or _DEFAULT_PORTS.get(scheme)
            except ValueError:
                continue
            if p.hostname and port:
                out.append((p.hostname, port))
        return out

    def __repr__(self) -> str:
        return (f"ServiceInfo(service_url={self.service_url!r}, use_tls={self.use_tls!r}, "
                f"tls_trust_certs_file_path={self.tls_trust_certs_file_path!r})")


class ServiceInfoProvider:
    """Base class of one's own service discovery: ``initial_service_info()`` gives the cluster to
    start on; ``initialize(on_service_info_update)`` gets the callback that switches the client
    (callable from any thread); ``close()`` is called when the client closes."""

    def initial_service_info(self) -> ServiceInfo:
        """The cluster the client starts on."""
        raise NotImplementedError

    def initialize(self, on_service_info_update: Callable[[ServiceInfo], None]) -> None:
        """Keep ``on_service_info_update`` and call it with a :class:`ServiceInfo` to switch."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop background work (called when the client closes)."""
        return None


class AutoClusterFailover:
    """Automatic failover between a ``primary`` cluster and ordered ``secondary`` ones, for
    ``Client(service_url=...)`` (probing as described in :mod:`txn.failover`)."""

    def __init__(self, primary: ServiceInfo, secondary: list[ServiceInfo], check_interval_ms: int = 5000,
                 failover_threshold: int = 1, switch_back_threshold: int = 1) -> None:
        _check(ServiceInfo, primary, "primary")
        _check(list, secondary, "secondary")
        _check(int, check_interval_ms, "check_interval_ms")
        _check(int, failover_threshold, "failover_threshold")
        _check(int, switch_back_threshold, "switch_back_threshold")
        if not secondary:
            raise ValueError("Argument secondary is expected to contain at least one ServiceInfo")
        for i, info in enumerate(secondary):
            if not isinstance(info, ServiceInfo):
                raise ValueError(f"Argument secondary[{i}] is expected to be of type 'ServiceInfo' and not "
                                 f"'{type(info).__name__}'")
        for name, value in (("check_interval_ms", check_interval_ms), ("failover_threshold", failover_threshold),
                            ("switch_back_threshold", switch_back_threshold)):
            if value <= 0:
                raise ValueError(f"Argument {name} is expected to be greater than 0")
        self.primary = primary
        self.secondary = list(secondary)
        self.check_interval_ms = check_interval_ms
        self.failover_threshold = failover_threshold
        self.switch_back_threshold = switch_back_threshold

    def __repr__(self) -> str:
        return (f"AutoClusterFailover(primary={self.primary!r}, secondary={self.secondary!r}, "
                f"check_interval_ms={self.check_interval_ms!r}, failover_threshold={self.failover_threshold!r}, "
                f"switch_back_threshold={self.switch_back_threshold!r})")


class ClusterSwitched(TransactionError):
    """The client switched to another cluster while this transaction was open: a transaction
    cannot move between clusters (its coordinator is on the old one). Open a new transaction."""


def check_client_arguments(service_url: Any, authentication: Any, tls_trust_certs_file_path: Any) -> None:
    """The official ``Client`` checks of ``service_url`` and what may not go with a failover config."""
    if not isinstance(service_url, (str, AutoClusterFailover, ServiceInfoProvider)):
        raise ValueError("Argument service_url is expected to be of type 'str', 'AutoClusterFailover' or "
                         "'ServiceInfoProvider'")
    if isinstance(service_url, str):
        return
    if authentication is not None:
        raise ValueError("Argument authentication is not supported when service_url is an AutoClusterFailover or "
                         "ServiceInfoProvider; set authentication on each ServiceInfo instead")
    if tls_trust_certs_file_path is not None:
        raise ValueError("Argument tls_trust_certs_file_path is not supported when service_url is an "
                         "AutoClusterFailover or ServiceInfoProvider; set tls_trust_certs_file_path on each "
                         "ServiceInfo instead")


def _service_info(value: Any) -> ServiceInfo:
    if not isinstance(value, ServiceInfo):
        raise ValueError(f"Expected a txn.ServiceInfo instance, got {type(value).__name__}")
    return value


class SwitchableCoordinator(CoordinatorClient):
    """A coordinator client of one cluster: once :meth:`retire`\\ d (the client switched cluster),
    every command of its transactions raises :class:`ClusterSwitched`."""

    def __init__(self, pool: Any, service_url: str) -> None:
        super().__init__(pool)
        self.service_url = service_url
        self._retired_for: str | None = None

    def retire(self, new_url: str) -> None:
        """Refuse every later command: the client now uses ``new_url``."""
        self._retired_for = new_url

    def check_current(self, txn_id: TxnID | None = None) -> None:
        """Raise :class:`ClusterSwitched` once retired."""
        if self._retired_for is not None:
            raise ClusterSwitched(
                f"the transaction was opened on cluster {self.service_url}, but the client switched to "
                f"{self._retired_for}; a transaction cannot move between clusters: open a new one", txn_id=txn_id)

    async def _conn(self, tc_id: int) -> Connection:
        self.check_current()
        return await super()._conn(tc_id)


class SwitchableTransaction(AsyncTransaction):
    """A transaction of a failover client: refused with :class:`ClusterSwitched` (sends, acks,
    commit, abort) once the client has moved to another cluster."""

    def __init__(self, coordinator: SwitchableCoordinator, txn_id: TxnID, timeout_ms: int) -> None:
        super().__init__(coordinator, txn_id, timeout_ms)
        self._cluster = coordinator

    def check_open(self) -> None:
        """As :meth:`AsyncTransaction.check_open`; :class:`ClusterSwitched` after a switch."""
        if self.state is TxnState.OPEN:
            self._cluster.check_current(self.id)
        super().check_open()


async def probe(info: ServiceInfo, timeout: float = PROBE_TIMEOUT_S) -> bool:
    """True if a TCP connection to one of ``info``'s hosts opens within ``timeout``."""
    for host, port in info.hosts():
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (OSError, TimeoutError):
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    return False


class _Prober(ServiceInfoProvider):
    """The runtime of an :class:`AutoClusterFailover`: an asyncio task on the client's loop."""

    def __init__(self, config: AutoClusterFailover) -> None:
        self.config = config
        self.current = config.primary
        self.failures = 0
        self.recoveries = 0
        self._update: Callable[[ServiceInfo], None] | None = None
        self._task: asyncio.Task[None] | None = None

    def initial_service_info(self) -> ServiceInfo:
        return self.config.primary

    def initialize(self, on_service_info_update: Callable[[ServiceInfo], None]) -> None:
        self._update = on_service_info_update
        self._task = asyncio.get_running_loop().create_task(self._run(), name="txn-cluster-failover")

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.config.check_interval_ms / 1000.0)
            try:
                await self._check()
            except Exception:  # a bug must not end the probing
                log.exception("cluster failover check failed")

    def _switch(self, info: ServiceInfo) -> None:
        if info is self.current:
            return
        log.info("switching service URL from %s to %s", self.current.service_url, info.service_url)
        self.current, self.failures, self.recoveries = info, 0, 0
        assert self._update is not None
        self._update(info)

    async def _first_secondary_up(self, skip: ServiceInfo | None = None) -> bool:
        for info in self.config.secondary:
            if info is not skip and await probe(info):
                self._switch(info)
                return True
        return False

    async def _maybe_switch_back(self) -> None:
        if await probe(self.config.primary):
            self.recoveries += 1
            if self.recoveries >= self.config.switch_back_threshold:
                self._switch(self.config.primary)
        else:
            self.recoveries = 0

    async def _check(self) -> None:
        cfg = self.config
        if self.current is cfg.primary:
            if await probe(cfg.primary):
                self.failures = 0
                return
            self.failures += 1
            if self.failures >= cfg.failover_threshold:
                await self._first_secondary_up()
            return
        if await probe(self.current):
            self.failures = 0
            await self._maybe_switch_back()
            return
        self.failures += 1
        if self.failures < cfg.failover_threshold:
            await self._maybe_switch_back()
        elif await probe(cfg.primary):
            self._switch(cfg.primary)
        elif not await self._first_secondary_up(skip=self.current):
            self.recoveries = 0


class ClusterFailover:
    """Connects a client to its ``service_url`` argument when that is an :class:`AutoClusterFailover`
    or a :class:`ServiceInfoProvider`: the first cluster, and the switches later."""

    def __init__(self, config: AutoClusterFailover | ServiceInfoProvider) -> None:
        self.provider = _Prober(config) if isinstance(config, AutoClusterFailover) else config
        #: The cluster in use.
        self.current = _service_info(self.provider.initial_service_info())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_switch: Callable[[ServiceInfo], None] | None = None
        self.closed = False
        #: How many times the client switched cluster.
        self.switches = 0

    def start(self, on_switch: Callable[[ServiceInfo], None]) -> None:
        """Call ``provider.initialize``; ``on_switch(info)`` then runs on this (the client's) loop."""
        self._loop = asyncio.get_running_loop()
        self._on_switch = on_switch
        self.provider.initialize(self._update)

    def _update(self, info: Any) -> None:
        info = _service_info(info)
        if self.closed or self._loop is None or self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._apply, info)

    def _apply(self, info: ServiceInfo) -> None:
        if self.closed or self._on_switch is None:
            return
        self.current = info
        self.switches += 1
        self._on_switch(info)

    def close(self) -> None:
        """Stop: ``provider.close()``; later updates are ignored."""
        if self.closed:
            return
        self.closed = True
        try:
            self.provider.close()
        except Exception:
            log.exception("closing the service info provider failed")
