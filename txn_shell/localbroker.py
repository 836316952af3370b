"""Fetch, configure, start, health-check and stop a real Pulsar standalone broker.

Stdlib only. The broker runs as a detached process bound to 127.0.0.1, with all
of its state (metadata, bookie data, logs, generated config, pid file) under one
data directory, so that another process (e.g. ``pulsar-txn broker stop``) can
find and manage it later.

A freshly started standalone broker does not load its transaction coordinators
(TCs) until a client sends ``TC_CLIENT_CONNECT_REQUEST`` for each TC to the broker
owning ``transaction_coordinator_assign-partition-<tc>``; until then ``NEW_TXN``
fails with ``TransactionCoordinatorNotFound``. :meth:`LocalBroker.start` does the
lookup + ``TC_CLIENT_CONNECT_REQUEST`` itself for every TC, so a client can open
transactions as soon as ``start()`` returns.

``LocalBroker(security=True)`` additionally generates (once per data dir) a test
CA, a broker certificate for 127.0.0.1/localhost and an HS256 token secret, and
turns on a TLS binary port and token authentication. Anonymous clients keep
working (``anonymousUserRole``, authorization off), so plain ``pulsar://``
clients, the broker's own internal clients and the transaction coordinators are
unaffected. Opt-in, for authentication tests: ``auth_providers`` adds the TLS
client-certificate and basic providers beside tokens (:meth:`LocalBroker.make_client_certificate`
signs client certificates with the test CA; ``basic_users`` fills the htpasswd file), and
``auth_refresh_check_seconds`` sets how often the broker checks for expired credentials.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import fcntl
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from txn.admin import admin_request, topic_path

from .metadata_sweep import SweepError, drop_ephemeral_nodes
from .pulsar_version import PULSAR_VERSION

__all__ = [
    "CONFIG_OVERRIDES",
    "PULSAR_VERSION",
    "BrokerError",
    "LocalBroker",
    "cache_dir",
    "ensure_distribution",
    "file_lock",
    "free_port",
    "log_tail",
    "loopback_interface",
    "port_free",
    "port_open",
    "signal_group",
    "generate_tls_material",
    "make_token",
    "probe_transaction_coordinator",
    "render_config",
]

HOST = "127.0.0.1"
DEFAULT_BROKER_PORT = 6650
DEFAULT_WEB_PORT = 8080
DEFAULT_BOOKIE_PORT = 3181
DEFAULT_BROKER_PORT_TLS = 6651
CLUSTER = "standalone"
TC_ASSIGN_TOPIC = "persistent://pulsar/system/transaction_coordinator_assign"

#: Keys overridden in the distribution's conf/standalone.conf (ports, bind
#: addresses and directories are added per instance by LocalBroker).
CONFIG_OVERRIDES: dict[str, str] = {
    # Loopback only; advertise the same address so lookups return 127.0.0.1.
    "bindAddress": HOST,
    "advertisedAddress": HOST,
    # Transactions: coordinator + transaction buffer (needs system topics).
    "transactionCoordinatorEnabled": "true",
    "systemTopicEnabled": "true",
    "topicLevelPoliciesEnabled": "true",
    # Needed for batch-index acks inside transactions.
    "acknowledgmentAtBatchIndexLevelEnabled": "true",
    # Dedup is off broker-wide; tests enable it per namespace via the admin API.
    "brokerDeduplicationEnabled": "false",
    # Tests must not see idle topics vanish after 60 s.
    "brokerDeleteInactiveTopicsEnabled": "false",
    # Not needed; saves threads.
    "webSocketServiceEnabled": "false",
    # The bookie reads this same file. Without allowEphemeralPorts=true a new
    # bookie ignores --bookkeeper-port and picks an arbitrary port (later
    # starts reuse the port stored in the bookie's cookie).
    "allowEphemeralPorts": "true",
    # Acknowledge an entry only once the bookie's journal is synced, as a production bookie does
    # (the distribution's standalone.conf turns this off). The chaos tests SIGKILL this process,
    # bookie and all; an entry acknowledged before its sync can then be lost, which leaves a
    # ledger that cannot be recovered or a transaction log that disagrees with a pending-ack log.
    # A sync costs well under a millisecond on the disks here (group commit amortises it).
    "journalSyncData": "true",
    # Keep the bookie's direct-memory caches small (default 25% of direct mem).
    "dbStorage_writeCacheMaxSizeMb": "64",
    "dbStorage_readAheadCacheMaxSizeMb": "64",
}

#: Role of the token in ``LocalBroker.token``; clients without credentials get
#: ANONYMOUS_ROLE.
TOKEN_ROLE = "tester"
ANONYMOUS_ROLE = "anonymous"


def _security_overrides(sec_dir: Path, tls_port: int) -> dict[str, str]:
    """Broker config for a TLS binary port + token authentication (anonymous allowed)."""
    return {
        "brokerServicePortTls": str(tls_port),
        "tlsCertificateFilePath": str(sec_dir / "broker.cert.pem"),
        "tlsKeyFilePath": str(sec_dir / "broker.key-pk8.pem"),
        "tlsTrustCertsFilePath": str(sec_dir / "ca.cert.pem"),
        "tlsRequireTrustedClientCertOnConnect": "false",
        "authenticationEnabled": "true",
        "authenticationProviders": "org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
        "tokenSecretKey": f"file://{sec_dir / 'token-secret.key'}",
        # Clients without credentials (other tests, the broker's internal
        # clients, the TC probe, the admin REST calls) are let in as this role;
        # authorization stays off so that role may do everything.
        "anonymousUserRole": ANONYMOUS_ROLE,
        "authorizationEnabled": "false",
    }


#: Authentication providers that ``LocalBroker(auth_providers=...)`` can add beside tokens.
AUTH_PROVIDERS: dict[str, str] = {
    "tls": "org.apache.pulsar.broker.authentication.AuthenticationProviderTls",
    "basic": "org.apache.pulsar.broker.authentication.AuthenticationProviderBasic",
}


def _auth_provider_overrides(sec_dir: Path, providers: tuple[str, ...],
                             refresh_check_seconds: int | None) -> dict[str, str]:
    """Broker config for the opt-in authentication providers and refresh check interval."""
    out: dict[str, str] = {}
    if providers:
        out["authenticationProviders"] = ",".join(
            ["org.apache.pulsar.broker.authentication.AuthenticationProviderToken",
             *(AUTH_PROVIDERS[p] for p in providers)])
    if "basic" in providers:
        out["basicAuthConf"] = str(sec_dir / BASIC_USERS_FILE)
    if refresh_check_seconds is not None:
        out["authenticationRefreshCheckSeconds"] = str(refresh_check_seconds)
    return out


#: The htpasswd file of the basic provider, in the security dir.
BASIC_USERS_FILE = "basic-users.htpasswd"


def htpasswd_line(user: str, password: str) -> str:
    """``user:$apr1$...`` (Apache MD5, what the broker's basic provider checks), from ``openssl passwd``."""
    if ":" in user or not user:
        raise BrokerError(f"a basic-auth user name must be non-empty and without ':', got {user!r}")
    openssl = shutil.which("openssl")
    if openssl is None:
        raise BrokerError("the openssl command is needed to hash basic-auth passwords")
    res = subprocess.run([openssl, "passwd", "-apr1", "-stdin"], input=password + "\n", capture_output=True,
                         text=True)
    if res.returncode != 0:
        raise BrokerError(f"openssl passwd failed: {res.stderr.strip()[-500:]}")
    return f"{user}:{res.stdout.strip()}"


def _authorization_overrides(token_file: Path) -> dict[str, str]:
    """Broker config that turns authorization on: role ``tester`` is the super-user, the broker's
    own clients authenticate with its token, and ``anonymous`` may do only what is granted to it."""
    return {
        "authorizationEnabled": "true",
        "superUserRoles": TOKEN_ROLE,
        "brokerClientAuthenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
        "brokerClientAuthenticationParameters": f"file://{token_file}",
    }


JVM_MEM = "-Xms512m -Xmx1g -XX:MaxDirectMemorySize=1g"
# The distribution default adds -XX:+AlwaysPreTouch (slow start) and ZGC.
JVM_GC = "-XX:+UseG1GC -XX:+PerfDisableSharedMem"

Progress = Callable[[str], None]


class BrokerError(RuntimeError):
    """The local broker could not be fetched, started, probed or stopped."""


# --------------------------------------------------------------------------
# Distribution


def cache_dir() -> Path:
    """``$PULSAR_TXN_CACHE`` or ``~/.cache/pulsar-txn``."""
    return Path(os.environ.get("PULSAR_TXN_CACHE") or "~/.cache/pulsar-txn").expanduser()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the ``with`` block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_distribution(progress: Progress = print, version: str = PULSAR_VERSION) -> Path:
    """Return the unpacked distribution dir, fetching it from Maven Central if needed."""
    cache = cache_dir()
    home = cache / f"apache-pulsar-{version}"
    marker = home / ".unpacked"
    if marker.exists():
        return home
    with file_lock(cache / ".lock"):
        if marker.exists():
            return home
        tarball = cache / "dl" / f"pulsar-server-distribution-{version}-bin.tar.gz"
        if not tarball.exists():
            mvn = shutil.which("mvn")
            if mvn is None:
                raise BrokerError("maven (mvn) is needed to fetch the Pulsar distribution")
            artifact = f"org.apache.pulsar:pulsar-server-distribution:{version}:tar.gz:bin"
            progress(f"fetching Pulsar {version} from Maven Central (~245 MB)...")
            t0 = time.monotonic()
            res = subprocess.run(
                [mvn, "-B", "-q", "dependency:copy", f"-Dartifact={artifact}",
                 f"-DoutputDirectory={tarball.parent}"],
                capture_output=True, text=True,
            )
            if res.returncode != 0 or not tarball.exists():
                raise BrokerError(f"maven fetch of {artifact} failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
            progress(f"fetched {tarball.name} in {time.monotonic() - t0:.0f}s")
        progress(f"unpacking {tarball.name} into {cache}...")
        t0 = time.monotonic()
        tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=cache))
        try:
            try:
                with tarfile.open(tarball) as tf:
                    if hasattr(tarfile, "data_filter"):
                        tf.extractall(tmp, filter="data")
                    else:  # pragma: no cover - Python < 3.11.4
                        tf.extractall(tmp)
            except (tarfile.TarError, EOFError, zlib.error) as e:
                tarball.unlink(missing_ok=True)
                raise BrokerError(f"{tarball} is corrupt ({e}); deleted it, run again to re-fetch") from e
            unpacked = tmp / f"apache-pulsar-{version}"
            if not (unpacked / "bin" / "pulsar").exists():
                raise BrokerError(f"{tarball} does not contain apache-pulsar-{version}/bin/pulsar")
            if home.exists():
                shutil.rmtree(home)
            unpacked.rename(home)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        marker.write_text(f"{version}\n")
        progress(f"unpacked in {time.monotonic() - t0:.0f}s: {home}")
    return home


def render_config(template: str, overrides: Mapping[str, str]) -> str:
    """Set ``key=value`` for each override, replacing existing lines or appending."""
    lines = template.splitlines()
    index = {}
    for i, line in enumerate(lines):
        m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*=", line)
        if m:
            index.setdefault(m.group(1), []).append(i)
    appended = []
    for key, value in overrides.items():
        where = index.get(key)
        if where:
            lines[where[0]] = f"{key}={value}"
            for i in where[1:]:
                lines[i] = f"# (overridden above) {lines[i]}"
        else:
            appended.append(f"{key}={value}")
    if appended:
        lines += ["", "# --- added by txn_shell.localbroker ---", *appended]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# Admin REST helpers


# --------------------------------------------------------------------------
# Minimal binary-protocol probe: CONNECT + TC_CLIENT_CONNECT_REQUEST


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _pb_int(num: int, v: int) -> bytes:
    return _varint(num << 3) + _varint(v)


def _pb_bytes(num: int, b: bytes) -> bytes:
    return _varint((num << 3) | 2) + _varint(len(b)) + b


def _pb_parse(b: bytes) -> dict[int, Any]:
    out: dict[int, Any] = {}
    i = 0
    while i < len(b):
        key, i = _read_varint(b, i)
        wire = key & 7
        if wire == 0:
            v, i = _read_varint(b, i)
        elif wire == 2:
            n, i = _read_varint(b, i)
            v, i = b[i:i + n], i + n
        elif wire == 1:
            v, i = b[i:i + 8], i + 8
        elif wire == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out[key >> 3] = v
    return out


def _read_varint(b: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        x = b[i]
        i += 1
        result |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            return result, i


def _send_cmd(sock: socket.socket, cmd_type: int, field: int, payload: bytes) -> None:
    cmd = _pb_int(1, cmd_type) + _pb_bytes(field, payload)
    sock.sendall(struct.pack(">II", len(cmd) + 4, len(cmd)) + cmd)


def _recv_cmd(sock: socket.socket) -> dict[int, Any]:
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return buf

    total, size = struct.unpack(">II", exact(8))
    return _pb_parse(exact(total - 4)[:size])


_CONNECT, _CONNECTED, _PING, _PONG = 2, 3, 18, 19
_TC_CONNECT_REQ, _TC_CONNECT_RESP = 62, 63


def probe_transaction_coordinator(host: str, port: int, tc_id: int, timeout: float = 30.0,
                                  token: str | None = None) -> None:
    """Send TC_CLIENT_CONNECT_REQUEST for ``tc_id``; raise BrokerError unless it succeeds.

    This is what makes the broker load (recover) that coordinator. The broker
    answers ServiceNotReady unless it owns the TC's assign partition, so do a
    lookup first. ``token`` authenticates the connection (needed with authorization on).
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        connect = _pb_bytes(1, b"txn-localbroker") + _pb_int(4, 21)
        if token:  # CommandConnect.auth_data (3) and auth_method_name (5)
            connect += _pb_bytes(3, token.encode()) + _pb_bytes(5, b"token")
        _send_cmd(sock, _CONNECT, 2, connect)
        reply = _recv_cmd(sock)
        if reply.get(1) != _CONNECTED:
            raise BrokerError(f"CONNECT rejected by {host}:{port}: {reply}")
        _send_cmd(sock, _TC_CONNECT_REQ, _TC_CONNECT_REQ, _pb_int(1, 1) + _pb_int(2, tc_id))
        while True:
            reply = _recv_cmd(sock)
            if reply.get(1) == _PING:
                _send_cmd(sock, _PONG, _PONG, b"")
            elif reply.get(1) == _TC_CONNECT_RESP:
                resp = _pb_parse(reply[_TC_CONNECT_RESP])
                if 2 in resp:
                    msg = bytes(resp.get(3, b"")).decode("utf-8", "replace")
                    raise BrokerError(f"TC {tc_id} not ready (server error {resp[2]}): {msg}")
                return


# --------------------------------------------------------------------------
# Security material: TLS certificates (openssl CLI) and HS256 tokens (stdlib)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def make_token(secret: bytes, subject: str, *, expires_at: float | None = None) -> str:
    """An HS256 JWT ``{"sub": subject[, "exp": expires_at]}`` signed with ``secret``.

    The same format as ``pulsar tokens create --secret-key ...``.
    """
    header = {"alg": "HS256"}
    claims: dict[str, Any] = {"sub": subject}
    if expires_at is not None:
        claims["exp"] = int(expires_at)
    signing_input = ".".join(
        _b64url(json.dumps(part, separators=(",", ":")).encode()) for part in (header, claims)
    )
    sig = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
    return f"{signing_input}.{_b64url(sig)}"


_OPENSSL_CONF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[v3_server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = {san}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""


def generate_tls_material(
    directory: Path, hosts: tuple[str, ...] = (HOST, "localhost"), days: int = 3650
) -> None:
    """Write a test CA and a broker certificate signed by it into ``directory``.

    Files: ``ca.cert.pem``, ``ca.key.pem``, ``broker.cert.pem`` (SAN: ``hosts``,
    IPs as IP entries) and ``broker.key-pk8.pem`` (unencrypted PKCS#8, as the
    broker needs). Uses the ``openssl`` command.
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise BrokerError("the openssl command is needed to generate TLS certificates")
    directory.mkdir(parents=True, exist_ok=True)
    san = ", ".join(
        f"IP:{h}" if re.fullmatch(r"[0-9.]+|[0-9a-fA-F:]*:[0-9a-fA-F:]*", h) else f"DNS:{h}" for h in hosts
    )
    conf = directory / "openssl.cnf"
    conf.write_text(_OPENSSL_CONF.format(san=san))

    def run(*args: str) -> None:
        res = subprocess.run([openssl, *args], cwd=directory, capture_output=True, text=True)
        if res.returncode != 0:
            raise BrokerError(f"openssl {' '.join(args[:2])} failed: {res.stderr.strip()[-2000:]}")

    rsa = ("-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048")
    run("genpkey", *rsa, "-out", "ca.key.pem")
    run("req", "-x509", "-new", "-config", str(conf), "-extensions", "v3_ca", "-key", "ca.key.pem",
        "-sha256", "-days", str(days), "-subj", "/O=txn-localbroker/CN=txn-localbroker test CA",
        "-out", "ca.cert.pem")
    run("genpkey", *rsa, "-out", "broker.key-pk8.pem")  # genpkey writes PKCS#8
    run("req", "-new", "-config", str(conf), "-key", "broker.key-pk8.pem",
        "-subj", f"/O=txn-localbroker/CN={hosts[0]}", "-out", "broker.csr")
    run("x509", "-req", "-in", "broker.csr", "-CA", "ca.cert.pem", "-CAkey", "ca.key.pem",
        "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-sha256", "-days", str(days),
        "-extfile", str(conf), "-extensions", "v3_server", "-out", "broker.cert.pem")
    (directory / "broker.csr").unlink()
    for key in ("ca.key.pem", "broker.key-pk8.pem"):
        (directory / key).chmod(0o600)


_CLIENT_EXT = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""


def generate_client_certificate(ca_dir: Path, common_name: str, cert_path: Path, key_path: Path,
                                days: int = 3650) -> None:
    """Write a client certificate (``CN=common_name``, clientAuth) signed by the CA in ``ca_dir``
    (``ca.cert.pem`` / ``ca.key.pem``, as :func:`generate_tls_material` writes them) and its
    unencrypted PKCS#8 key. Uses the ``openssl`` command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise BrokerError("the openssl command is needed to generate TLS certificates")
    tmp = Path(tempfile.mkdtemp(prefix=".client-cert-", dir=ca_dir))
    try:
        def run(*args: str) -> None:
            res = subprocess.run([openssl, *args], cwd=tmp, capture_output=True, text=True)
            if res.returncode != 0:
                raise BrokerError(f"openssl {' '.join(args[:2])} failed: {res.stderr.strip()[-2000:]}")

        (tmp / "client.ext").write_text(_CLIENT_EXT)
        run("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "client.key")
        run("req", "-new", "-key", "client.key", "-subj", f"/O=txn-localbroker/CN={common_name}", "-out", "client.csr")
        run("x509", "-req", "-in", "client.csr", "-CA", str(ca_dir / "ca.cert.pem"), "-CAkey",
            str(ca_dir / "ca.key.pem"), "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-sha256",
            "-days", str(days), "-extfile", "client.ext", "-out", "client.cert")
        (tmp / "client.key").chmod(0o600)
        (tmp / "client.key").rename(key_path)
        (tmp / "client.cert").rename(cert_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --------------------------------------------------------------------------
# Process helpers


def free_port() -> int:
    """An ephemeral TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def loopback_interface() -> str | None:
    """Name of the loopback network interface (``lo``/``lo0``), or None."""
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in ("lo", "lo0") if n in names), None)


def port_free(port: int) -> bool:
    """True if ``port`` can be bound on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
        return True


def port_open(port: int, timeout: float = 1.0) -> bool:
    """True if something accepts TCP connections on 127.0.0.1:``port``."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid``'s process group if it leads one (started with its own session), else to ``pid``."""
    with contextlib.suppress(ProcessLookupError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def log_tail(path: Path, start: int = 0, lines: int = 40) -> str:
    """The last ``lines`` lines of ``path`` written after byte offset ``start``."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(start, end - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class LocalBroker:
    """A Pulsar standalone broker process on 127.0.0.1 with state in ``data_dir``.

    Ports not given explicitly are taken from the data dir's saved state (so a
    later ``LocalBroker(data_dir)`` in another process finds a running broker
    and restarts reuse the same ports), else the Pulsar defaults.

    ``security=True`` adds a TLS binary port (:attr:`service_url_tls`, trusted
    via :attr:`ca_cert_path`) and token authentication (:attr:`token` is valid
    for role ``tester``; :meth:`mint_token` makes others). Clients without
    credentials are still accepted, as role ``anonymous``. ``security=None``
    means "as saved in the data dir" (off for a new one).
    """

    def __init__(
        self,
        data_dir: str | os.PathLike[str] | None = None,
        *,
        broker_port: int | None = None,
        web_port: int | None = None,
        bookie_port: int | None = None,
        transaction_coordinators: int | None = None,
        pulsar_home: str | os.PathLike[str] | None = None,
        progress: Progress = print,
        security: bool | None = None,
        broker_port_tls: int | None = None,
        authorization: bool | None = None,
        auth_providers: tuple[str, ...] | None = None,
        auth_refresh_check_seconds: int | None = None,
        basic_users: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir) if data_dir else cache_dir() / "standalone-data"
        self.data_dir = self.data_dir.expanduser().resolve()
        saved = self._load_state()
        self.broker_port: int = broker_port or saved.get("broker_port") or DEFAULT_BROKER_PORT
        self.web_port: int = web_port or saved.get("web_port") or DEFAULT_WEB_PORT
        # Once the bookie has data, Pulsar reuses the port recorded in its cookie
        # (the bookie id is host:port) and ignores --bookkeeper-port.
        known = self._cookie_bookie_port() or bookie_port or saved.get("bookie_port")
        #: False when no port was given, saved or in the bookie's cookie: start() then moves off
        #: DEFAULT_BOOKIE_PORT if another bookie holds it, so two brokers can run side by side.
        self._bookie_port_fixed = known is not None
        self.bookie_port: int = known or DEFAULT_BOOKIE_PORT
        self.transaction_coordinators: int = (
            transaction_coordinators or saved.get("transaction_coordinators") or 1
        )
        self.security: bool = bool(saved.get("security", False) if security is None else security)
        self.authorization: bool = bool(
            saved.get("authorization", False) if authorization is None else authorization)
        if self.authorization and not self.security:
            raise BrokerError("authorization needs security=True (token authentication)")
        #: Providers beside tokens ("tls", "basic"); () unless asked for (or saved).
        self.auth_providers: tuple[str, ...] = tuple(
            saved.get("auth_providers", ()) if auth_providers is None else auth_providers)
        unknown = set(self.auth_providers) - set(AUTH_PROVIDERS)
        if unknown:
            raise BrokerError(f"unknown auth provider(s) {sorted(unknown)}; known: {sorted(AUTH_PROVIDERS)}")
        if self.auth_providers and not self.security:
            raise BrokerError("auth_providers need security=True")
        #: ``authenticationRefreshCheckSeconds`` (None: the broker's default, 60 s).
        self.auth_refresh_check_seconds: int | None = (
            saved.get("auth_refresh_check_seconds") if auth_refresh_check_seconds is None
            else auth_refresh_check_seconds)
        self._basic_users = dict(basic_users or {})
        if self._basic_users and "basic" not in self.auth_providers:
            raise BrokerError("basic_users need auth_providers to include 'basic'")
        self.broker_port_tls: int | None = (
            (broker_port_tls or saved.get("broker_port_tls") or DEFAULT_BROKER_PORT_TLS) if self.security else None
        )
        if saved.get("pid") and self._is_our_process(saved["pid"]):
            # Already running: its actual ports (and security mode) win over the arguments.
            self.broker_port, self.web_port = saved["broker_port"], saved["web_port"]
            self.security = bool(saved.get("security", False))
            self.authorization = bool(saved.get("authorization", False))
            self.broker_port_tls = saved.get("broker_port_tls") if self.security else None
            self.auth_providers = tuple(saved.get("auth_providers", ()))
            self.auth_refresh_check_seconds = saved.get("auth_refresh_check_seconds")
        self._pulsar_home = Path(pulsar_home) if pulsar_home else None
        self.progress = progress
        self._proc: subprocess.Popen[bytes] | None = None
        self._exit_code: int | None = None
        self._log_offset = 0

    # -- paths / urls -------------------------------------------------------

    @property
    def service_url(self) -> str:
        return f"pulsar://{HOST}:{self.broker_port}"

    @property
    def admin_url(self) -> str:
        return f"http://{HOST}:{self.web_port}"

    @property
    def service_url_tls(self) -> str | None:
        """``pulsar+ssl://127.0.0.1:<tls port>``, or None without ``security``."""
        return f"pulsar+ssl://{HOST}:{self.broker_port_tls}" if self.security else None

    @property
    def security_dir(self) -> Path:
        """Where the CA, broker certificate, token secret and token live."""
        return self.data_dir / "security"

    @property
    def ca_cert_path(self) -> Path | None:
        """PEM file of the CA that signed the broker's certificate (None without ``security``)."""
        return self.security_dir / "ca.cert.pem" if self.security else None

    @property
    def token_secret_path(self) -> Path:
        return self.security_dir / "token-secret.key"

    @property
    def token_path(self) -> Path:
        """File holding :attr:`token` (usable as ``AuthenticationToken("file://...")``)."""
        return self.security_dir / f"{TOKEN_ROLE}.token"

    @property
    def token(self) -> str | None:
        """A non-expiring token for role ``tester`` (None without ``security`` or before the first start)."""
        if not self.security:
            return None
        try:
            return self.token_path.read_text().strip()
        except OSError:
            return None

    def mint_token(self, role: str = TOKEN_ROLE, *, expires_in: float | None = None) -> str:
        """A token for ``role`` signed with this broker's secret; ``expires_in`` seconds (may be < 0)."""
        try:
            secret = self.token_secret_path.read_bytes()
        except OSError as e:
            raise BrokerError(f"no token secret in {self.security_dir}; start with security=True first") from e
        exp = None if expires_in is None else time.time() + expires_in
        return make_token(secret, role, expires_at=exp)

    def _write_basic_users(self) -> None:
        """Write ``basic_users`` as the basic provider's htpasswd file (kept as is when none were
        given, so a restart keeps the users; an empty file when there never were any)."""
        path = self.security_dir / BASIC_USERS_FILE
        if not self._basic_users and path.exists():
            return
        lines = [htpasswd_line(user, pw) for user, pw in sorted(self._basic_users.items())]
        path.write_text("".join(line + "\n" for line in lines))
        path.chmod(0o600)

    def make_client_certificate(self, role: str = TOKEN_ROLE, days: int = 3650) -> tuple[Path, Path]:
        """A client certificate with CN ``role`` signed by this broker's test CA, for TLS
        authentication (the broker's TLS provider takes the role from the CN).

        Returns ``(certificate, private key)`` PEM paths under :attr:`security_dir`
        (``client-<role>.cert.pem`` / ``client-<role>.key-pk8.pem``), made once per role.
        """
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", role):
            raise BrokerError(f"a client certificate role must be letters, digits, '_', '.' or '-': {role!r}")
        if not (self.security_dir / ".complete").exists():
            raise BrokerError(f"no test CA in {self.security_dir}; start with security=True first")
        cert, key = self.security_dir / f"client-{role}.cert.pem", self.security_dir / f"client-{role}.key-pk8.pem"
        if cert.exists() and key.exists():
            return cert, key
        generate_client_certificate(self.security_dir, role, cert, key, days=days)
        return cert, key

    def _ensure_security_material(self) -> None:
        """Generate the CA, broker cert, token secret and token once per data dir."""
        sec = self.security_dir
        if (sec / ".complete").exists():
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".security-", dir=self.data_dir))
        try:
            self.progress(f"generating TLS certificates and token secret in {sec}")
            generate_tls_material(tmp)
            secret = os.urandom(32)
            (tmp / "token-secret.key").write_bytes(secret)
            (tmp / "token-secret.key").chmod(0o600)
            (tmp / f"{TOKEN_ROLE}.token").write_text(make_token(secret, TOKEN_ROLE))
            (tmp / ".complete").write_text("")
            tmp.chmod(0o700)
            if sec.exists():
                shutil.rmtree(sec)
            tmp.rename(sec)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    @property
    def log_file(self) -> Path:
        return self.data_dir / "logs" / "broker.log"

    @property
    def pid_file(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def conf_file(self) -> Path:
        return self.data_dir / "conf" / "standalone.conf"

    @property
    def _state_file(self) -> Path:
        return self.data_dir / "broker.json"

    @property
    def _unclean_marker(self) -> Path:
        """Exists from a spawn until :meth:`stop` sees that standalone exit on a bare SIGTERM: while
        it does, the metadata store may hold ephemeral nodes of a standalone that was killed, or
        whose bookie could not release them after its broker service had closed."""
        return self.data_dir / ".unclean-stop"

    def _cookie_bookie_port(self) -> int | None:
        try:
            text = (self.data_dir / "bookkeeper" / "current" / "VERSION").read_text()
        except OSError:
            return None
        m = re.search(r'bookieHost:\s*"[^"]*:(\d+)"', text)
        return int(m.group(1)) if m else None

    def _load_state(self) -> dict[str, Any]:
        try:
            return json.loads(self._state_file.read_text())
        except (OSError, ValueError):
            return {}

    # -- process tracking ---------------------------------------------------

    @property
    def pid(self) -> int | None:
        """Pid of the running broker process, or None."""
        if self._proc is not None:
            if self._proc.poll() is None:
                return self._proc.pid
            self._exit_code = self._proc.returncode
            self._proc = None
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if self._is_our_process(pid) else None

    def _is_our_process(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return False
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            return b"PulsarStandaloneStarter" in cmdline and str(self.conf_file).encode() in cmdline
        except FileNotFoundError:
            return False
        except OSError:  # no /proc: fall back to "a process with that pid exists"
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
            return True

    def is_running(self) -> bool:
        return self.pid is not None

    # -- config -------------------------------------------------------------

    def _write_config(self, home: Path) -> None:
        template = (home / "conf" / "standalone.conf").read_text()
        overrides = dict(CONFIG_OVERRIDES)
        overrides.update(
            brokerServicePort=str(self.broker_port),
            webServicePort=str(self.web_port),
            narExtractionDirectory=str(self.data_dir / "nar"),
        )
        if self.security:
            assert self.broker_port_tls is not None
            self._ensure_security_material()
            overrides.update(_security_overrides(self.security_dir, self.broker_port_tls))
            if self.authorization:
                overrides.update(_authorization_overrides(self.token_path))
            if "basic" in self.auth_providers:
                self._write_basic_users()
            overrides.update(_auth_provider_overrides(self.security_dir, self.auth_providers,
                                                      self.auth_refresh_check_seconds))
        lo = loopback_interface()
        if lo:  # make the bookie bind to 127.0.0.1 (advertisedAddress) instead of 0.0.0.0
            overrides["listeningInterface"] = lo
        self.conf_file.parent.mkdir(parents=True, exist_ok=True)
        self.conf_file.write_text(render_config(template, overrides))

    def _save_state(self, pid: int | None) -> None:
        state = {
            "version": PULSAR_VERSION,
            "broker_port": self.broker_port,
            "web_port": self.web_port,
            "bookie_port": self.bookie_port,
            "transaction_coordinators": self.transaction_coordinators,
            "security": self.security,
            "authorization": self.authorization,
            "broker_port_tls": self.broker_port_tls,
            "auth_providers": list(self.auth_providers),
            "auth_refresh_check_seconds": self.auth_refresh_check_seconds,
            "pid": pid,
        }
        self._state_file.write_text(json.dumps(state, indent=2) + "\n")

    # -- lifecycle ----------------------------------------------------------

    def start(self, timeout: float = 180) -> bool:
        """Start the broker and wait until it is healthy with its TCs loaded.

        Returns False (after waiting for health) if this data dir's broker was
        already running, True if a new process was started. Raises BrokerError
        if a port is taken, the process dies, or it is not ready in time.
        """
        home = self._pulsar_home or ensure_distribution(self.progress)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with file_lock(self.data_dir / ".lock"):
            pid = self.pid
            if pid is not None:
                self.progress(f"broker already running (pid {pid}) at {self.service_url}")
                started = False
            else:
                if not self._bookie_port_fixed and not port_free(self.bookie_port):
                    self.bookie_port = free_port()
                    self.progress(f"bookie port {DEFAULT_BOOKIE_PORT} is taken; using {self.bookie_port}")
                ports = [self.broker_port, self.web_port, self.bookie_port]
                if self.broker_port_tls is not None:
                    ports.append(self.broker_port_tls)
                busy = [p for p in ports if not port_free(p)]
                if busy:
                    raise BrokerError(f"port(s) {busy} on {HOST} already in use; is another broker running?")
                if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
                    raise BrokerError("java not found on PATH and JAVA_HOME is not set")
                if self._unclean_marker.exists():
                    self._drop_stale_ephemeral_nodes(home)
                self._spawn(home)
                started = True
        self.wait_ready(timeout)
        return started

    def _drop_stale_ephemeral_nodes(self, home: Path) -> None:
        """Delete the ephemeral nodes (bookie registration, broker locks) a standalone that did not
        stop cleanly left in the metadata store. Left there, the next bookie's registration can loop
        forever, deleting and recreating itself (see :mod:`txn_shell.metadata_sweep`)."""
        t0 = time.monotonic()
        try:
            dropped = drop_ephemeral_nodes(home, self.data_dir / "metadata", cache_dir() / "tools")
        except SweepError as e:  # start anyway: the loop is a race the new standalone may not lose
            self.progress(f"warning: could not remove the previous broker's ephemeral metadata nodes: {e}")
            return
        if dropped:
            self.progress(
                f"removed {len(dropped)} ephemeral metadata node(s) of the previous, killed broker "
                f"in {time.monotonic() - t0:.1f}s: {', '.join(dropped[:5])}{' ...' if len(dropped) > 5 else ''}"
            )

    def _spawn(self, home: Path) -> None:
        self._write_config(home)
        self._unclean_marker.write_text("")
        self._exit_code = None
        logs = self.log_file.parent
        logs.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(
            PULSAR_MEM=JVM_MEM,
            PULSAR_GC=JVM_GC,
            PULSAR_GC_LOG=f"-Xlog:gc:file={logs / 'gc.log'}:time,uptime:filecount=2,filesize=10M",
            PULSAR_LOG_DIR=str(logs),
            PULSAR_STANDALONE_CONF=str(self.conf_file),
        )
        cmd = [
            str(home / "bin" / "pulsar"), "standalone",
            "--no-functions-worker", "--no-stream-storage",
            "-c", str(self.conf_file),
            "--metadata-dir", str(self.data_dir / "metadata"),
            "--bookkeeper-dir", str(self.data_dir / "bookkeeper"),
            "--bookkeeper-port", str(self.bookie_port),
        ]
        with open(self.log_file, "ab") as log:
            stamp = datetime.datetime.now().isoformat(timespec="seconds")
            log.write(f"\n===== txn_shell.localbroker: starting Pulsar {PULSAR_VERSION} at {stamp} =====\n".encode())
            log.flush()
            self._log_offset = log.tell()
            self._proc = subprocess.Popen(
                cmd, cwd=self.data_dir, env=env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        self.pid_file.write_text(f"{self._proc.pid}\n")
        self._save_state(self._proc.pid)
        self.progress(f"started Pulsar {PULSAR_VERSION} standalone (pid {self._proc.pid}), log: {self.log_file}")

    def wait_ready(self, timeout: float = 180) -> None:
        """Wait until :meth:`is_healthy` after loading every TC; BrokerError on death/timeout."""
        t0 = time.monotonic()
        next_report = t0 + 10
        reason = "not checked yet"
        while True:
            if self.pid is None:
                code = self._exit_code
                raise BrokerError(
                    f"broker process exited (code {code}) during start; last log lines of {self.log_file}:\n"
                    + log_tail(self.log_file, self._log_offset)
                )
            reason = self._check(warm=True)
            if reason is None:
                self.progress(f"broker ready at {self.service_url} after {time.monotonic() - t0:.1f}s")
                return
            now = time.monotonic()
            if now - t0 > timeout:
                tail = log_tail(self.log_file, self._log_offset)
                raise BrokerError(
                    f"broker (pid {self.pid}, still running) not ready after {timeout:.0f}s ({reason}); "
                    f"log tail of {self.log_file}:\n{tail}"
                )
            if now >= next_report:
                self.progress(f"waiting for broker... ({now - t0:.0f}s elapsed: {reason})")
                next_report = now + 10
            time.sleep(0.5)

    def _check(self, warm: bool) -> str | None:
        """None if healthy, else why not. ``warm`` loads TCs and sets the TC count."""
        token = self.token if self.authorization else None  # anonymous is refused with authorization on

        def req(method: str, path: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
            return admin_request(method, self.admin_url, path, body, timeout=timeout, token=token)

        try:
            status, body = req("GET", "/admin/v2/clusters", timeout=5)
            if status != 200 or CLUSTER not in (body or []):
                return f"admin API: GET /admin/v2/clusters -> {status}"
            if not port_open(self.broker_port):
                return f"binary port {self.broker_port} not accepting connections"
            if self.broker_port_tls is not None and not port_open(self.broker_port_tls):
                return f"TLS binary port {self.broker_port_tls} not accepting connections"
            tc_path = f"/admin/v2/{topic_path(TC_ASSIGN_TOPIC)}/partitions"
            status, body = req("GET", tc_path, timeout=5)
            n = body.get("partitions", 0) if status == 200 and isinstance(body, dict) else 0
            if n <= 0:
                return "transaction coordinator assign topic not created yet"
            if n > self.transaction_coordinators:  # the data dir already has more
                self.transaction_coordinators = n
            if warm and n < self.transaction_coordinators:
                # Updating answers 409 (the broker refuses to create the assign
                # partitions as topics) but the new count is stored; re-read it.
                req("POST", tc_path, self.transaction_coordinators)
                return f"raising transaction coordinators {n} -> {self.transaction_coordinators}"
            status, stats = req("GET", "/admin/v3/transactions/coordinatorStats")
            ready = status == 200 and isinstance(stats, dict) and len(stats) == n and all(
                s.get("state") == "Ready" for s in stats.values())
            if ready:
                return None
            if not warm:
                return "transaction coordinators not loaded"
            for tc in range(n):
                topic = f"{topic_path(TC_ASSIGN_TOPIC)}-partition-{tc}"
                status, body = req("GET", f"/lookup/v2/topic/{topic}")
                if status != 200:
                    return f"lookup of TC {tc} assign partition -> {status}"
                probe_transaction_coordinator(HOST, self.broker_port, tc, token=token)
            return "transaction coordinators loading"
        except (OSError, BrokerError, ValueError) as e:
            return f"{type(e).__name__}: {e}"

    def is_healthy(self) -> bool:
        """Admin API answers, binary port accepts connections, all TCs are Ready."""
        return self.is_running() and self._check(warm=False) is None

    def status(self) -> dict[str, Any]:
        """Running/health summary (pid, urls, ports, data dir, log file)."""
        pid = self.pid
        detail = self._check(warm=False) if pid is not None else "not running"
        return {
            "running": pid is not None,
            "pid": pid,
            "healthy": detail is None,
            "detail": detail or "ok",
            "version": PULSAR_VERSION,
            "service_url": self.service_url,
            "admin_url": self.admin_url,
            "security": self.security,
            "authorization": self.authorization,
            "auth_providers": list(self.auth_providers),
            "service_url_tls": self.service_url_tls,
            "broker_port": self.broker_port,
            "broker_port_tls": self.broker_port_tls,
            "web_port": self.web_port,
            "bookie_port": self.bookie_port,
            "transaction_coordinators": self.transaction_coordinators,
            "data_dir": str(self.data_dir),
            "log_file": str(self.log_file),
        }

    def stop(self, timeout: float = 60) -> bool:
        """Close the broker service, then SIGTERM the process (its bookie), then SIGKILL after
        ``timeout``. Data is kept. False if not running.

        A standalone runs its broker and its bookie in one JVM, and on SIGTERM both shutdown
        hooks run at once: the bookie goes away while the broker still closes its topics and
        transaction logs, so their last writes fail and a clean stop looks like a storage crash
        to the broker. Closing the broker service first, through the admin API, gives the order a
        deployment has: brokers stop while their bookies run."""
        pid = self.pid
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        self.progress(f"stopping broker (pid {pid})...")
        t0 = time.monotonic()
        graceful = self._close_broker_service(timeout)
        if not graceful:
            self.progress("broker service did not close through the admin API; stopping it with its bookie")
        self._signal(pid, signal.SIGTERM)
        if self._wait_exit(pid, timeout):
            # A bare SIGTERM lets the bookie release its ephemeral nodes. After the broker service
            # closed first, the bookie sometimes cannot (the metadata store it shares with the broker
            # is closing): the marker stays, and the next start sweeps (well under a second).
            if not graceful:
                self._unclean_marker.unlink(missing_ok=True)
        else:
            self.progress(f"broker did not exit within {timeout:.0f}s; killing it")
            self._signal(pid, signal.SIGKILL)
            if not self._wait_exit(pid, 30):
                raise BrokerError(f"broker pid {pid} survived SIGKILL")
        self.pid_file.unlink(missing_ok=True)
        self._save_state(None)
        self.progress(f"broker stopped in {time.monotonic() - t0:.1f}s")
        return True

    def _close_broker_service(self, timeout: float) -> bool:
        """Ask the broker to unload its topics and close its service (``POST /brokers/shutdown``);
        True once it has. The JVM and its bookie keep running until the SIGTERM that follows."""
        token = self.token if self.authorization else None
        try:
            status, _ = admin_request("POST", self.admin_url, "/admin/v2/brokers/shutdown?forcedTerminateTopic=true",
                                      timeout=timeout, token=token)
        except OSError:
            return False
        return status in (200, 204)

    def kill(self) -> bool:
        """SIGKILL the broker (no graceful shutdown). False if not running."""
        pid = self.pid
        if pid is None:
            return False
        self._signal(pid, signal.SIGKILL)
        if not self._wait_exit(pid, 30):
            raise BrokerError(f"broker pid {pid} survived SIGKILL")
        self.pid_file.unlink(missing_ok=True)
        self._save_state(None)
        return True

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        signal_group(pid, sig)

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.pid == pid:
                try:
                    self._proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    continue
                self._proc = None
                return True
            if not self._is_our_process(pid):
                return True
            time.sleep(0.2)
        return False

    def __repr__(self) -> str:
        return f"LocalBroker({str(self.data_dir)!r}, service_url={self.service_url!r}, pid={self.pid})"
