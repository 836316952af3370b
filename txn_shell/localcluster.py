"""A real Pulsar cluster on this machine: ZooKeeper, 3 bookies, 3 brokers, on loopback.

Every process comes from the pinned distribution that :mod:`txn_shell.localbroker`
fetches (:func:`~txn_shell.localbroker.ensure_distribution`), runs detached in its own
process group, and keeps its config, data, log and pid file under one data directory.
The chosen ports are recorded in ``<data dir>/cluster.json``, so a later
``LocalCluster(data_dir)`` (another process, ``pulsar-txn cluster status|stop``) finds
the running cluster and a restart reuses the same ports (the bookies' cookies hold
theirs).

Shape, chosen to exercise what a standalone broker never does:

- the metadata store is one ZooKeeper server; brokers use a short session timeout
  (:data:`SESSION_TIMEOUT_MS`), so the bundles of a SIGKILLed broker move within seconds;
- 3 bookies with ensemble 2, write quorum 2, ack quorum 2: any one bookie may die;
- 3 brokers with transactions on and :data:`DEFAULT_COORDINATORS` transaction
  coordinators (set by ``initialize-cluster-metadata --initial-num-transaction-coordinators``);
  :meth:`LocalCluster.start` loads every coordinator and moves their bundles so that they
  are spread over the brokers;
- small JVM heaps (:data:`JVM_MEM`) so that the 7 JVMs fit beside a test run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from txn.admin import admin_request, topic_path

from .localbroker import (
    CONFIG_OVERRIDES,
    HOST,
    JVM_GC,
    TC_ASSIGN_TOPIC,
    BrokerError,
    Progress,
    cache_dir,
    ensure_distribution,
    file_lock,
    free_port,
    log_tail,
    loopback_interface,
    port_free,
    port_open,
    probe_transaction_coordinator,
    render_config,
    signal_group,
)
from .pulsar_version import PULSAR_VERSION

__all__ = ["DEFAULT_COORDINATORS", "ClusterError", "LocalCluster", "Node"]

CLUSTER_NAME = "txn-local"
DEFAULT_BOOKIES = 3
DEFAULT_BROKERS = 3
DEFAULT_COORDINATORS = 4
#: Broker metadata-store session: how long a SIGKILLed broker keeps its bundles.
SESSION_TIMEOUT_MS = 6000

#: Heap and direct memory per JVM: 7 JVMs, about 2.5 GB of RSS in all.
JVM_MEM = {
    "zookeeper": "-Xms64m -Xmx128m",
    "bookie": "-Xms128m -Xmx256m -XX:MaxDirectMemorySize=192m",
    "broker": "-Xms256m -Xmx512m -XX:MaxDirectMemorySize=256m",
}


class ClusterError(BrokerError):
    """The local cluster could not be started, checked or stopped."""


def _put(url: str, path: str, redirects: int = 3) -> int:
    """PUT to the admin API, following redirects (urllib follows them only for GET); the final status."""
    for _ in range(redirects + 1):
        req = urllib.request.Request(url + path, method="PUT")
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status
        except urllib.error.HTTPError as e:
            location = e.headers.get("Location")
            if e.code not in (301, 302, 307, 308) or not location:
                return e.code
            parts = urllib.parse.urlsplit(location)
            url, path = f"{parts.scheme}://{parts.netloc}", parts.path + (f"?{parts.query}" if parts.query else "")
    return 307


@dataclass
class Node:
    """One process of the cluster: ``zookeeper``, ``bookie-<i>`` or ``broker-<i>``."""

    name: str
    role: str
    ports: dict[str, int]

    @property
    def port(self) -> int:
        """The main port: ZooKeeper client port, bookie port or broker binary port."""
        return next(iter(self.ports.values()))


class LocalCluster:
    """ZooKeeper, bookies and brokers of one Pulsar cluster on 127.0.0.1, state in ``data_dir``."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        bookies: int = DEFAULT_BOOKIES,
        brokers: int = DEFAULT_BROKERS,
        coordinators: int = DEFAULT_COORDINATORS,
        pulsar_home: str | os.PathLike[str] | None = None,
        progress: Progress = print,
    ) -> None:
        self.data_dir = Path(data_dir or cache_dir() / "cluster-data").expanduser().resolve()
        self.progress = progress
        self._pulsar_home = Path(pulsar_home) if pulsar_home else None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        saved = self._load_state()
        if saved:
            self.cluster = saved["cluster"]
            self.coordinators = saved["coordinators"]
            self.nodes = [Node(n["name"], n["role"], n["ports"]) for n in saved["nodes"]]
        else:
            self.cluster = CLUSTER_NAME
            self.coordinators = coordinators
            self.nodes = self._choose_ports(bookies, brokers)

    # -- layout ---------------------------------------------------------------

    @staticmethod
    def _choose_ports(bookies: int, brokers: int) -> list[Node]:
        taken: set[int] = set()

        def port() -> int:
            while True:
                p = free_port()
                if p not in taken:
                    taken.add(p)
                    return p

        nodes = [Node("zookeeper", "zookeeper", {"client": port()})]
        nodes += [Node(f"bookie-{i}", "bookie", {"bookie": port()}) for i in range(bookies)]
        nodes += [Node(f"broker-{i}", "broker", {"broker": port(), "web": port()}) for i in range(brokers)]
        return nodes

    def _role(self, role: str) -> list[Node]:
        return [n for n in self.nodes if n.role == role]

    @property
    def zookeeper(self) -> Node:
        return self._role("zookeeper")[0]

    @property
    def bookies(self) -> list[Node]:
        return self._role("bookie")

    @property
    def brokers(self) -> list[Node]:
        return self._role("broker")

    @property
    def zk_connect(self) -> str:
        return f"{HOST}:{self.zookeeper.port}"

    def broker_url(self, i: int) -> str:
        """``pulsar://`` URL of broker ``i`` alone."""
        return f"pulsar://{HOST}:{self.brokers[i].ports['broker']}"

    def admin_url_of(self, i: int) -> str:
        """Admin REST URL of broker ``i``."""
        return f"http://{HOST}:{self.brokers[i].ports['web']}"

    @property
    def service_url(self) -> str:
        """``pulsar://h:p1,h:p2,h:p3``: every broker."""
        return "pulsar://" + ",".join(f"{HOST}:{b.ports['broker']}" for b in self.brokers)

    @property
    def admin_url(self) -> str:
        """Admin URL of the first running broker (broker 0 if none runs)."""
        for i, b in enumerate(self.brokers):
            if self.pid(b) is not None:
                return self.admin_url_of(i)
        return self.admin_url_of(0)

    def _dir(self, node: Node) -> Path:
        return self.data_dir / node.name

    def _conf(self, node: Node) -> Path:
        return self._dir(node) / f"{node.role}.conf"

    def _pid_file(self, node: Node) -> Path:
        return self._dir(node) / "pid"

    def log_file(self, node: Node) -> Path:
        """The node's log: its console output (where the distribution's log4j config sends the log)."""
        return self.data_dir / "logs" / f"{node.name}.out"

    @property
    def _state_file(self) -> Path:
        return self.data_dir / "cluster.json"

    def _load_state(self) -> dict[str, Any]:
        try:
            return json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save_state(self) -> None:
        state = {
            "version": PULSAR_VERSION,
            "cluster": self.cluster,
            "coordinators": self.coordinators,
            "nodes": [{"name": n.name, "role": n.role, "ports": n.ports} for n in self.nodes],
        }
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._state_file.write_text(json.dumps(state, indent=2) + "\n")

    # -- config ---------------------------------------------------------------

    def _overrides(self, node: Node) -> dict[str, str]:
        d = self._dir(node)
        if node.role == "zookeeper":
            return {
                "dataDir": str(d / "data"),
                "clientPort": str(node.port),
                "clientPortAddress": HOST,
                "admin.enableServer": "false",
                # The Prometheus provider binds port 8000; the default one binds nothing.
                "metricsProvider.className": "org.apache.zookeeper.metrics.impl.DefaultMetricsProvider",
            }
        if node.role == "bookie":
            o = {
                "bookiePort": str(node.port),
                "advertisedAddress": HOST,
                "allowLoopback": "true",
                "metadataServiceUri": f"zk+hierarchical://{self.zk_connect}/ledgers",
                "zkServers": self.zk_connect,
                "zkTimeout": "10000",
                "journalDirectory": str(d / "journal"),
                "ledgerDirectories": str(d / "ledgers"),
                # No HTTP or stats server: nothing binds beyond the bookie port.
                "httpServerEnabled": "false",
                "enableStatistics": "false",
                "statsProviderClass": "org.apache.bookkeeper.stats.NullStatsProvider",
                "dbStorage_writeCacheMaxSizeMb": "16",
                "dbStorage_readAheadCacheMaxSizeMb": "16",
                "dbStorage_rocksDB_blockCacheSize": str(16 * 1024 * 1024),
                # Acknowledge an entry only once the journal is synced: with write quorum = ack quorum,
                # one bookie that lost an acknowledged entry (journalSyncData=false and a SIGKILL) is
                # enough for ledger recovery to truncate it.
                "journalSyncData": "true",
            }
            lo = loopback_interface()
            if lo:
                o["listeningInterface"] = lo
            return o
        i = self.brokers.index(node)
        o = {k: v for k, v in CONFIG_OVERRIDES.items() if not k.startswith(("dbStorage_", "allowEphemeral"))}
        o.update(
            clusterName=self.cluster,
            metadataStoreUrl=f"zk:{self.zk_connect}",
            configurationMetadataStoreUrl=f"zk:{self.zk_connect}",
            metadataStoreSessionTimeoutMillis=str(SESSION_TIMEOUT_MS),
            brokerServicePort=str(node.ports["broker"]),
            webServicePort=str(node.ports["web"]),
            managedLedgerDefaultEnsembleSize="2",
            managedLedgerDefaultWriteQuorum="2",
            managedLedgerDefaultAckQuorum="2",
            managedLedgerCacheSizeMB="32",
            brokerShutdownTimeoutMs="5000",
            functionsWorkerEnabled="false",
            narExtractionDirectory=str(self.data_dir / f"nar-{i}"),
        )
        return o

    def _write_config(self, home: Path, node: Node) -> None:
        template = (home / "conf" / f"{'bookkeeper' if node.role == 'bookie' else node.role}.conf").read_text()
        self._dir(node).mkdir(parents=True, exist_ok=True)
        self._conf(node).write_text(render_config(template, self._overrides(node)))

    # -- processes ------------------------------------------------------------

    def pid(self, node: Node) -> int | None:
        """Pid of the node's running process, or None."""
        proc = self._procs.get(node.name)
        if proc is not None and proc.poll() is not None:
            del self._procs[node.name]
        try:
            pid = int(self._pid_file(node).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self._is_ours(node, pid) else None

    def _is_ours(self, node: Node, pid: int) -> bool:
        proc = self._procs.get(node.name)
        if proc is not None and proc.pid == pid:
            return proc.poll() is None
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return False
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return str(self._conf(node)).encode() in f.read()
        except OSError:
            return False

    def _spawn(self, home: Path, node: Node) -> None:
        self._write_config(home, node)
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        mem = JVM_MEM[node.role]
        env = dict(os.environ)
        env.update(
            PULSAR_MEM=mem, BOOKIE_MEM=mem, PULSAR_GC=JVM_GC, BOOKIE_GC=JVM_GC,
            PULSAR_GC_LOG=f"-Xlog:gc:file={logs / node.name}-gc.log:time,uptime:filecount=2,filesize=5M",
            BOOKIE_GC_LOG=f"-Xlog:gc:file={logs / node.name}-gc.log:time,uptime:filecount=2,filesize=5M",
            PULSAR_LOG_DIR=str(logs), BOOKIE_LOG_DIR=str(logs), PULSAR_LOG_FILE=f"{node.name}.log",
        )
        conf = str(self._conf(node))
        if node.role == "zookeeper":
            env["PULSAR_ZK_CONF"] = conf
            cmd = [str(home / "bin" / "pulsar"), "zookeeper"]
        elif node.role == "bookie":
            env["PULSAR_BOOKKEEPER_CONF"] = conf
            cmd = [str(home / "bin" / "pulsar"), "bookie"]
        else:
            env["PULSAR_BROKER_CONF"] = conf
            cmd = [str(home / "bin" / "pulsar"), "broker"]
        with open(self.log_file(node), "ab") as out:
            self._procs[node.name] = proc = subprocess.Popen(
                cmd, cwd=self._dir(node), env=env, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self._pid_file(node).write_text(f"{proc.pid}\n")

    def _home(self) -> Path:
        home = self._pulsar_home or ensure_distribution(self.progress)
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            raise ClusterError("java not found on PATH and JAVA_HOME is not set")
        return home

    def _wait(self, what: str, nodes: Iterable[Node], check, deadline: float, t0: float) -> None:  # noqa: ANN001
        """Poll ``check(node) -> None | reason`` for every node until all pass; fail on death or deadline."""
        pending = list(nodes)
        next_report = time.monotonic() + 10
        reason = "not checked yet"
        while pending:
            for node in list(pending):
                if self.pid(node) is None:
                    raise ClusterError(f"{node.name} exited during start; log tail of {self.log_file(node)}:\n"
                                       + log_tail(self.log_file(node)))
                try:
                    reason = check(node)
                except (OSError, ValueError, BrokerError) as e:
                    reason = f"{type(e).__name__}: {e}"
                if reason is None:
                    pending.remove(node)
            now = time.monotonic()
            if not pending:
                break
            if now > deadline:
                names = ", ".join(n.name for n in pending)
                raise ClusterError(f"{what} not ready before the start timeout ({names}: {reason}); logs in "
                                   f"{self.data_dir / 'logs'}:\n" + log_tail(self.log_file(pending[0])))
            if now >= next_report:
                self.progress(f"  ... waiting for {what} ({now - t0:.0f}s elapsed; {pending[0].name}: {reason})")
                next_report = now + 10
            time.sleep(0.5)
        self.progress(f"{what} ready ({time.monotonic() - t0:.0f}s elapsed)")

    def _broker_ready(self, node: Node) -> str | None:
        url = f"http://{HOST}:{node.ports['web']}"
        status, _ = admin_request("GET", url, "/admin/v2/brokers/ready", timeout=5)
        if status != 200:
            return f"GET /admin/v2/brokers/ready -> {status}"
        if not port_open(node.ports["broker"]):
            return f"binary port {node.ports['broker']} closed"
        status, active = admin_request("GET", url, f"/admin/v2/brokers/{self.cluster}", timeout=5)
        if status != 200 or f"{HOST}:{node.ports['web']}" not in (active or []):
            return f"not yet among the active brokers ({active})"
        return None

    def _port_check(self, node: Node) -> str | None:
        return None if port_open(node.port) else f"port {node.port} closed"

    def start(self, timeout: float = 300) -> bool:
        """Start every node that is not running and wait until the cluster serves transactions.

        Returns False if everything was already running. Raises ClusterError on a busy port, a
        process that dies, or a cluster that is not ready within ``timeout`` seconds.
        """
        home = self._home()
        t0 = time.monotonic()
        deadline = t0 + timeout
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with file_lock(self.data_dir / ".lock"):
            self._save_state()
            down = [n for n in self.nodes if self.pid(n) is None]
            busy = [f"{n.name}:{p}" for n in down for p in n.ports.values() if not port_free(p)]
            if busy:
                raise ClusterError(f"port(s) {busy} on {HOST} already in use; is another cluster running?")
            self.progress(f"starting Pulsar {PULSAR_VERSION} cluster {self.cluster!r} in {self.data_dir} "
                          f"({len(down)} of {len(self.nodes)} processes to start)")
            zk = self.zookeeper
            if zk in down:
                self._spawn(home, zk)
                self.progress(f"zookeeper: pid {self.pid(zk)}, port {zk.port}")
            self._wait("zookeeper", [zk], self._port_check, deadline, t0)
            self._initialize(home, deadline)
            for node in [n for n in down if n.role == "bookie"]:
                self._spawn(home, node)
                self.progress(f"{node.name}: pid {self.pid(node)}, port {node.port}")
            self._wait("bookies", self.bookies, self._port_check, deadline, t0)
            for node in [n for n in down if n.role == "broker"]:
                self._spawn(home, node)
                self.progress(f"{node.name}: pid {self.pid(node)}, ports {node.ports}")
            self._wait("brokers", self.brokers, self._broker_ready, deadline, t0)
        self.load_coordinators(deadline - time.monotonic())
        self.progress(f"cluster ready in {time.monotonic() - t0:.0f}s: service URL {self.service_url}")
        return bool(down)

    def _initialize(self, home: Path, deadline: float) -> None:
        marker = self.data_dir / ".initialized"
        if marker.exists():
            return
        b0 = self.brokers[0]
        cmd = [
            str(home / "bin" / "pulsar"), "initialize-cluster-metadata",
            "--cluster", self.cluster,
            "--metadata-store", f"zk:{self.zk_connect}",
            "--configuration-metadata-store", f"zk:{self.zk_connect}",
            "--web-service-url", f"http://{HOST}:{b0.ports['web']}",
            "--broker-service-url", f"pulsar://{HOST}:{b0.ports['broker']}",
            "--initial-num-transaction-coordinators", str(self.coordinators),
        ]
        self.progress("initializing cluster metadata (cluster, bookkeeper, "
                      f"{self.coordinators} transaction coordinators)...")
        env = dict(os.environ, PULSAR_MEM="-Xms64m -Xmx256m", PULSAR_LOG_DIR=str(self.data_dir / "logs"))
        remaining = max(10.0, deadline - time.monotonic())
        try:
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=remaining)
        except subprocess.TimeoutExpired as e:
            raise ClusterError(f"initialize-cluster-metadata did not finish in {remaining:.0f}s") from e
        (self.data_dir / "logs" / "initialize.log").write_text(res.stdout + res.stderr)
        if res.returncode != 0:
            raise ClusterError(f"initialize-cluster-metadata failed ({res.returncode}):\n{res.stdout[-3000:]}"
                               f"{res.stderr[-3000:]}")
        marker.write_text(f"{self.cluster}\n")

    # -- transaction coordinators ---------------------------------------------

    def _tc_topic(self, tc: int) -> str:
        return f"{TC_ASSIGN_TOPIC}-partition-{tc}"

    def coordinator_owner(self, tc: int) -> int:
        """Index of the broker that owns coordinator ``tc`` (a lookup; it may assign the bundle)."""
        status, body = admin_request("GET", self.admin_url, f"/lookup/v2/topic/{topic_path(self._tc_topic(tc))}")
        if status != 200 or not isinstance(body, dict):
            raise ClusterError(f"lookup of coordinator {tc} -> {status}: {body}")
        port = int(body["brokerUrl"].rsplit(":", 1)[1])
        for i, b in enumerate(self.brokers):
            if b.ports["broker"] == port:
                return i
        raise ClusterError(f"coordinator {tc} is on an unknown broker {body['brokerUrl']}")

    def coordinator_owners(self) -> dict[int, int]:
        """``{tc id: broker index}`` for every coordinator."""
        return {tc: self.coordinator_owner(tc) for tc in range(self.coordinators)}

    def _coordinators_ready(self) -> str | None:
        status, stats = admin_request("GET", self.admin_url, "/admin/v3/transactions/coordinatorStats")
        if status != 200 or not isinstance(stats, dict):
            return f"coordinatorStats -> {status}"
        bad = {k: v.get("state") for k, v in stats.items() if v.get("state") != "Ready"}
        if len(stats) != self.coordinators or bad:
            return f"coordinators not ready: {len(stats)} known, not ready: {bad}"
        return None

    def load_coordinators(self, timeout: float = 120) -> None:
        """Spread the coordinators' bundles over the brokers and load every coordinator."""
        t0 = time.monotonic()
        deadline = t0 + max(timeout, 10)
        reason: str | None = "not checked"
        spread_tries = 3  # a load manager may not honour the destination: do not insist
        next_report = t0 + 10
        while True:
            try:
                owners = self.coordinator_owners()
                if spread_tries > 0:
                    spread_tries = 0 if self._spread(owners) else spread_tries - 1
                    if spread_tries > 0:
                        continue
                    owners = self.coordinator_owners()
                for tc, i in owners.items():
                    probe_transaction_coordinator(HOST, self.brokers[i].ports["broker"], tc, timeout=15)
                reason = self._coordinators_ready()
            except (OSError, ValueError, KeyError, BrokerError) as e:
                reason = f"{type(e).__name__}: {e}"
            if reason is None:
                where = ", ".join(f"tc{tc}->broker-{i}" for tc, i in sorted(self.coordinator_owners().items()))
                self.progress(f"{self.coordinators} transaction coordinators ready ({where}) "
                              f"in {time.monotonic() - t0:.0f}s")
                return
            now = time.monotonic()
            if now > deadline:
                raise ClusterError(f"transaction coordinators not ready in {timeout:.0f}s: {reason}")
            if now >= next_report:
                self.progress(f"  ... loading transaction coordinators ({now - t0:.0f}s: {reason})")
                next_report = now + 10
            time.sleep(1)

    def _spread(self, owners: dict[int, int]) -> bool:
        """Unload the bundles of coordinators that share a broker onto idle brokers; True if spread."""
        live = [i for i, b in enumerate(self.brokers) if self.pid(b) is not None]
        want = min(len(live), len(owners))
        if len(set(owners.values())) >= want:
            return True
        used: dict[int, list[int]] = {}
        for tc, i in owners.items():
            used.setdefault(i, []).append(tc)
        idle = [i for i in live if i not in used]
        moved = False
        for i, tcs in used.items():
            for tc in tcs[1:]:
                if not idle:
                    break
                dest = idle.pop(0)
                status, body = admin_request("GET", self.admin_url,
                                             f"/lookup/v2/topic/{topic_path(self._tc_topic(tc))}/bundle")
                if status != 200 or not isinstance(body, (str, dict)):
                    continue
                bundle = body if isinstance(body, str) else body.get("bundle", "")
                if not bundle:
                    continue
                dest_id = f"{HOST}:{self.brokers[dest].ports['web']}"
                status = _put(self.admin_url_of(i),
                              f"/admin/v2/namespaces/pulsar/system/{bundle}/unload?destinationBroker={dest_id}")
                self.progress(f"moving coordinator {tc}'s bundle {bundle} broker-{i} -> broker-{dest}: {status}")
                moved = True
        if not moved:
            return True  # several TCs hash into one bundle: nothing more to move
        time.sleep(1)
        return False

    # -- one node at a time (for tests) ---------------------------------------

    def node(self, name: str) -> Node:
        """The node called ``name`` (``zookeeper``, ``bookie-<i>``, ``broker-<i>``)."""
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def kill(self, name: str) -> int:
        """SIGKILL one node; returns the pid killed. ClusterError if it was not running."""
        node = self.node(name)
        pid = self.pid(node)
        if pid is None:
            raise ClusterError(f"{name} is not running")
        signal_group(pid, signal.SIGKILL)
        if not self._wait_exit(node, pid, 30):
            raise ClusterError(f"{name} (pid {pid}) survived SIGKILL")
        self._pid_file(node).unlink(missing_ok=True)
        self._wait_ports_free(node)
        self.progress(f"SIGKILLed {name} (pid {pid})")
        return pid

    def _wait_ports_free(self, node: Node, timeout: float = 20) -> None:
        """A killed JVM's main thread is a zombie while its other threads still hold the sockets."""
        deadline = time.monotonic() + timeout
        while not all(port_free(p) for p in node.ports.values()):
            if time.monotonic() > deadline:
                raise ClusterError(f"{node.name}'s ports {node.ports} still taken {timeout:.0f}s after it exited")
            time.sleep(0.2)

    def restart_node(self, name: str, timeout: float = 180) -> None:
        """Start one stopped node again and wait until it serves (a broker: among the active brokers)."""
        node = self.node(name)
        if self.pid(node) is not None:
            return
        self._wait_ports_free(node)
        t0 = time.monotonic()
        self._spawn(self._home(), node)
        check = self._broker_ready if node.role == "broker" else self._port_check
        self._wait(name, [node], check, t0 + timeout, t0)

    def _wait_exit(self, node: Node, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self._procs.get(node.name)
            if proc is not None and proc.pid == pid:
                try:
                    proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    continue
                del self._procs[node.name]
                return True
            if not self._is_ours(node, pid):
                return True
            time.sleep(0.2)
        return False

    # -- whole cluster ----------------------------------------------------------

    def is_running(self) -> bool:
        """True if any node runs."""
        return any(self.pid(n) is not None for n in self.nodes)

    def stop(self, timeout: float = 30) -> bool:
        """SIGTERM brokers, then bookies, then ZooKeeper; SIGKILL what outlives ``timeout``. Data is kept."""
        stopped = False
        for role in ("broker", "bookie", "zookeeper"):
            running = [(n, p) for n in self._role(role) if (p := self.pid(n)) is not None]
            for _, pid in running:
                signal_group(pid, signal.SIGTERM)
            for node, pid in running:
                if not self._wait_exit(node, pid, timeout):
                    self.progress(f"{node.name} (pid {pid}) did not exit in {timeout:.0f}s; SIGKILL")
                    signal_group(pid, signal.SIGKILL)
                    if not self._wait_exit(node, pid, 30):
                        raise ClusterError(f"{node.name} (pid {pid}) survived SIGKILL")
                self._pid_file(node).unlink(missing_ok=True)
                self._wait_ports_free(node)
                self.progress(f"stopped {node.name} (pid {pid})")
                stopped = True
        return stopped

    def rss_bytes(self) -> int:
        """Resident memory of every running node (JVMs), summed."""
        total = 0
        for n in self.nodes:
            pid = self.pid(n)
            if pid is None:
                continue
            try:
                text = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            m = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
            total += int(m.group(1)) * 1024 if m else 0
        return total

    def status(self) -> dict[str, Any]:
        """Each node's pid and ports, whether it answers, and the coordinators' owners."""
        nodes = []
        for n in self.nodes:
            pid = self.pid(n)
            ok = pid is not None and (self._broker_ready(n) is None if n.role == "broker"
                                      else self._port_check(n) is None)
            nodes.append({"name": n.name, "pid": pid, "running": pid is not None, "serving": ok,
                          "ports": n.ports, "log": str(self.log_file(n))})
        out: dict[str, Any] = {
            "cluster": self.cluster, "version": PULSAR_VERSION, "data_dir": str(self.data_dir),
            "service_url": self.service_url, "admin_url": self.admin_url, "nodes": nodes,
            "healthy": all(x["serving"] for x in nodes), "rss_mb": self.rss_bytes() // (1024 * 1024),
        }
        if out["healthy"]:
            try:
                out["coordinators"] = {f"tc{tc}": f"broker-{i}" for tc, i in self.coordinator_owners().items()}
                out["coordinators_ready"] = self._coordinators_ready() or "ok"
            except (OSError, ValueError, KeyError, BrokerError) as e:
                out["coordinators_ready"] = f"{type(e).__name__}: {e}"
        return out

    def __repr__(self) -> str:
        return f"LocalCluster({str(self.data_dir)!r}, service_url={self.service_url!r})"
