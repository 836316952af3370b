"""A throwaway PostgreSQL cluster for the tests (installs nothing; see deploy/postgres.md).

``postgres_cluster()`` yields a ``postgresql://`` URL: PULSAR_TXN_TEST_PG_URL if set, else a
fresh cluster from Debian's PostgreSQL binaries — ``initdb`` into a temp dir, ``pg_ctl start``
on a free 127.0.0.1 port with its unix socket in that dir, ``createdb`` — stopped and removed
afterwards. As root the server runs as the ``postgres`` user (initdb refuses root).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from txn_shell.localbroker import free_port

DB_NAME = "txn_test"


def pg_bindir() -> str:
    """The newest ``/usr/lib/postgresql/<v>/bin`` (Debian's layout), or ``pg_config --bindir``."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2].split(".")[0]))
    for d in reversed(dirs):
        if os.path.exists(os.path.join(d, "initdb")):
            return d
    pg_config = shutil.which("pg_config")
    if pg_config:
        d = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
        if os.path.exists(os.path.join(d, "initdb")):
            return d
    raise RuntimeError("PostgreSQL server binaries not found: apt-get install postgresql (see deploy/postgres.md)")


def _run(argv: list[str], user: str | None, **kw: object) -> subprocess.CompletedProcess[str]:
    if user is not None:
        argv = ["runuser", "-u", user, "--", *argv]
    res = subprocess.run(argv, capture_output=True, text=True, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


@contextmanager
def postgres_cluster() -> Iterator[str]:
    """Yield the URL of a PostgreSQL database for the tests; stop the cluster on exit."""
    url = os.environ.get("PULSAR_TXN_TEST_PG_URL")
    if url:
        yield url
        return
    bindir = pg_bindir()
    user = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            raise RuntimeError("running as root needs the 'postgres' user (created by Debian's postgresql)") from None
        user = "postgres"
    root = tempfile.mkdtemp(prefix="pulsar-txn-pg-", dir="/tmp")
    data, sock, log = os.path.join(root, "data"), os.path.join(root, "sock"), os.path.join(root, "server.log")
    os.mkdir(sock)
    if user is not None:
        pw = pwd.getpwnam(user)
        for p in (root, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    started = False
    try:
        _run([f"{bindir}/initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"], user,
             cwd=root)
        for _attempt in range(3):
            port = free_port()
            opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50"
            try:
                _run([f"{bindir}/pg_ctl", "-D", data, "-l", log, "-o", opts, "-w", "-t", "60", "start"], user,
                     cwd=root)
            except RuntimeError:
                continue  # the port was taken meanwhile: try another
            started = True
            break
        if not started:
            raise RuntimeError(f"PostgreSQL did not start; log in {log}")
        _run([f"{bindir}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", DB_NAME], user, cwd=root)
        yield f"postgresql://postgres@127.0.0.1:{port}/{DB_NAME}"
    finally:
        if started:
            subprocess.run(
                ([] if user is None else ["runuser", "-u", user, "--"])
                + [f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "-w", "-t", "60", "stop"],
                capture_output=True, cwd=root,
            )
        shutil.rmtree(root, ignore_errors=True)
