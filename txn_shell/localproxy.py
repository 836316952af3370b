"""Start and stop a real Apache Pulsar Proxy (``bin/pulsar proxy``) in front of a broker.

The proxy comes from the pinned distribution that :mod:`txn_shell.localbroker` fetches
(:func:`~txn_shell.localbroker.ensure_distribution`), runs detached in its own process group on
free loopback ports, and keeps its generated config, log and pid file under one directory.

It finds the broker by URL (``brokerServiceURL`` / ``brokerWebServiceURL``), with no metadata
store: the way the proxy is run in front of a cluster on Kubernetes. A client that connects to
:attr:`LocalProxy.service_url` sends its lookups to the proxy, which forwards them to the broker
and answers "connect through the proxy"; the client then opens a connection to the proxy naming
the broker (``proxy_to_broker_url``), and the proxy relays it byte for byte. The transaction
coordinators are found the same way (a lookup of ``transaction_coordinator_assign-partition-N``),
so transactions work through the proxy with no setting of their own. What the proxy does need:

- ``brokerProxyAllowedTargetPorts``: the proxy refuses to relay to a port not listed (the
  default lists only 6650 and 6651; a test broker runs on a free port);
- ``brokerProxyAllowedHostNames`` / ``brokerProxyAllowedIPAddresses``: the broker's host only;
- ``bindAddress`` and ``advertisedAddress``: 127.0.0.1 (nothing listens beyond loopback);
- ``clusterName`` (the broker's cluster): Pulsar 4's proxy does not start without it.

The proxy's web port forwards the admin REST API (``/admin``, ``/lookup``) to the broker, so
:attr:`LocalProxy.admin_url` works as an admin URL.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path

from txn.admin import admin_request

from .localbroker import (
    CLUSTER,
    HOST,
    JVM_GC,
    BrokerError,
    Progress,
    _pb_bytes,
    _pb_int,
    _recv_cmd,
    _send_cmd,
    ensure_distribution,
    free_port,
    log_tail,
    port_free,
    port_open,
    render_config,
    signal_group,
)
from .pulsar_version import PULSAR_VERSION

__all__ = ["ProxyError", "LocalProxy", "proxy_overrides"]

#: The proxy relays bytes and holds no data: a small heap is plenty.
JVM_MEM = "-Xms64m -Xmx256m -XX:MaxDirectMemorySize=256m"

_CONNECT, _CONNECTED = 2, 3


class ProxyError(BrokerError):
    """The local proxy could not be started or stopped."""


def _host_port(url: str, default_port: int) -> tuple[str, int]:
    u = urllib.parse.urlsplit(url)
    if not u.hostname:
        raise ProxyError(f"no host in {url!r}")
    return u.hostname, u.port or default_port


def proxy_overrides(broker_service_url: str, broker_web_url: str, service_port: int,
                    web_port: int, cluster: str = CLUSTER) -> dict[str, str]:
    """The keys set in the distribution's ``conf/proxy.conf`` for a proxy in front of one broker."""
    host, port = _host_port(broker_service_url, 6650)
    return {
        # Brokers by URL, no metadata store (no service discovery, no proxy-side authorization).
        "metadataStoreUrl": "",
        "configurationMetadataStoreUrl": "",
        "brokerServiceURL": broker_service_url,
        "brokerWebServiceURL": broker_web_url,
        # Loopback only, on free ports.
        "bindAddress": HOST,
        "advertisedAddress": HOST,
        "servicePort": str(service_port),
        "webServicePort": str(web_port),
        "servicePortTls": "",
        "webServicePortTls": "",
        # The proxy relays a client's connection only to an allowed broker host and port; the
        # default ports are 6650,6651 only.
        "brokerProxyAllowedTargetPorts": str(port),
        "brokerProxyAllowedHostNames": host,
        "brokerProxyAllowedIPAddresses": socket.gethostbyname(host),
        # Pulsar 4's proxy refuses to start without it (its OpenTelemetry metrics are labelled with it).
        "clusterName": cluster,
        # Not needed; saves threads.
        "webSocketServiceEnabled": "false",
        "authenticationEnabled": "false",
        "authorizationEnabled": "false",
    }


class LocalProxy:
    """A Pulsar Proxy process on 127.0.0.1 in front of the broker at ``broker_service_url``.

    ``data_dir`` (default: a new directory under /tmp) holds ``conf/proxy.conf``, ``logs/proxy.log``
    and ``proxy.pid``. Ports not given are free ones. ``start()`` waits until the binary port
    completes a Pulsar handshake and the web port forwards an admin call to the broker.
    """

    def __init__(
        self,
        broker_service_url: str,
        broker_web_url: str,
        *,
        data_dir: str | os.PathLike[str] | None = None,
        service_port: int | None = None,
        web_port: int | None = None,
        pulsar_home: str | os.PathLike[str] | None = None,
        progress: Progress = print,
    ) -> None:
        self.broker_service_url = broker_service_url
        self.broker_web_url = broker_web_url
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="pulsar-txn-proxy-", dir="/tmp")).resolve()
        self.service_port: int = service_port or free_port()
        web = web_port
        while web is None or web == self.service_port:
            web = free_port()
        self.web_port: int = web
        self._pulsar_home = Path(pulsar_home) if pulsar_home else None
        self.progress = progress
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    # -- paths / urls -------------------------------------------------------

    @property
    def service_url(self) -> str:
        return f"pulsar://{HOST}:{self.service_port}"

    @property
    def admin_url(self) -> str:
        """The proxy's web port: it forwards ``/admin`` and ``/lookup`` calls to the broker."""
        return f"http://{HOST}:{self.web_port}"

    @property
    def conf_file(self) -> Path:
        return self.data_dir / "conf" / "proxy.conf"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "logs" / "proxy.log"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "proxy.pid"

    @property
    def pid(self) -> int | None:
        """Pid of the running proxy process (started by this object), or None."""
        if self._proc is not None and self._proc.poll() is None:
            return self._proc.pid
        return None

    def is_running(self) -> bool:
        return self.pid is not None

    # -- lifecycle ----------------------------------------------------------

    def start(self, timeout: float = 120) -> None:
        """Start the proxy and wait until it is ready; ProxyError if it dies or is not ready in time."""
        if self.is_running():
            return
        home = self._pulsar_home or ensure_distribution(self.progress)
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise ProxyError("java not found on PATH and JAVA_HOME is not set")
        busy = [p for p in (self.service_port, self.web_port) if not port_free(p)]
        if busy:
            raise ProxyError(f"port(s) {busy} on {HOST} already in use")
        template = (home / "conf" / "proxy.conf").read_text()
        self.conf_file.parent.mkdir(parents=True, exist_ok=True)
        overrides = proxy_overrides(self.broker_service_url, self.broker_web_url, self.service_port, self.web_port)
        overrides["narExtractionDirectory"] = str(self.data_dir / "nar")
        self.conf_file.write_text(render_config(template, overrides))
        logs = self.log_file.parent
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            PULSAR_MEM=JVM_MEM, PULSAR_GC=JVM_GC,
            PULSAR_GC_LOG=f"-Xlog:gc:file={logs / 'gc.log'}:time,uptime:filecount=2,filesize=5M",
            PULSAR_LOG_DIR=str(logs), PULSAR_LOG_FILE="proxy.log", PULSAR_PROXY_CONF=str(self.conf_file),
        )
        with open(self.log_file, "ab") as log:
            stamp = datetime.datetime.now().isoformat(timespec="seconds")
            log.write(f"\n===== txn_shell.localproxy: starting Pulsar {PULSAR_VERSION} proxy at {stamp} =====\n"
                      .encode())
            log.flush()
            self._log_offset = log.tell()
            self._proc = subprocess.Popen(
                [str(home / "bin" / "pulsar"), "proxy"], cwd=self.data_dir, env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")
        self.progress(f"started Pulsar {PULSAR_VERSION} proxy (pid {self._proc.pid}) at {self.service_url} "
                      f"for {self.broker_service_url}, log: {self.log_file}")
        self.wait_ready(timeout)

    def _check(self) -> str | None:
        """None if ready, else why not."""
        if not port_open(self.service_port):
            return f"binary port {self.service_port} not accepting connections"
        try:
            with socket.create_connection((HOST, self.service_port), timeout=10) as sock:
                _send_cmd(sock, _CONNECT, 2, _pb_bytes(1, b"txn-localproxy") + _pb_int(4, 21))
                reply = _recv_cmd(sock)
            if reply.get(1) != _CONNECTED:
                return f"CONNECT to the proxy answered {reply}"
            status, _ = admin_request("GET", self.admin_url, "/admin/v2/clusters", timeout=10)
        except (OSError, ValueError) as e:
            return f"{type(e).__name__}: {e}"
        if status != 200:
            return f"GET /admin/v2/clusters through the proxy -> {status}"
        return None

    def wait_ready(self, timeout: float = 120) -> None:
        t0 = time.monotonic()
        next_report = t0 + 10
        while True:
            if not self.is_running():
                code = None if self._proc is None else self._proc.returncode
                raise ProxyError(f"proxy exited (code {code}) during start; last log lines of {self.log_file}:\n"
                                 + log_tail(self.log_file, self._log_offset))
            reason = self._check()
            if reason is None:
                self.progress(f"proxy ready at {self.service_url} after {time.monotonic() - t0:.1f}s")
                return
            now = time.monotonic()
            if now - t0 > timeout:
                raise ProxyError(f"proxy (pid {self.pid}) not ready after {timeout:.0f}s ({reason}); "
                                 f"log tail of {self.log_file}:\n" + log_tail(self.log_file, self._log_offset))
            if now >= next_report:
                self.progress(f"waiting for the proxy... ({now - t0:.0f}s elapsed: {reason})")
                next_report = now + 10
            time.sleep(0.5)

    def stop(self, timeout: float = 30) -> bool:
        """SIGTERM, then SIGKILL after ``timeout``. False if it was not running."""
        proc = self._proc
        if proc is None:
            return False
        running = proc.poll() is None
        if running:
            signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                signal_group(proc.pid, signal.SIGKILL)
                proc.wait(30)
        self._proc = None
        self.pid_file.unlink(missing_ok=True)
        return running

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_file, self._log_offset, lines)

    def __enter__(self) -> LocalProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.stop()

    def __repr__(self) -> str:
        return f"LocalProxy({self.service_url!r} -> {self.broker_service_url!r}, pid={self.pid})"
