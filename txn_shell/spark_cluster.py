"""Start, stop or inspect a throwaway Spark standalone cluster (one master + one worker) on 127.0.0.1.

Uses the Spark that ships inside the installed ``pyspark`` package (``SPARK_HOME`` = the package
dir, ``bin/spark-class``), so nothing beyond the venv and a Java 17 runtime is needed. Everything
binds to loopback on free ports; logs, pid files, the worker's scratch dirs, an empty
``SPARK_CONF_DIR`` and ``cluster.json`` (master URL, web UI URL, pids) live in ``--dir``.

    python -m txn_shell.spark_cluster start  --dir D [--cores 1] [--memory 1g]   # prints the master URL
    python -m txn_shell.spark_cluster status --dir D [--json]
    python -m txn_shell.spark_cluster stop   --dir D

Importable too: ``start_cluster(dir) -> master_url``, ``cluster_status(dir) -> dict``,
``stop_cluster(dir)``. The processes run in their own session and outlive the caller until ``stop``.

Start-up (bounded by ``timeout`` as a whole): the master and the worker are spawned together (the
worker's JVM starts while the master's does; a worker that is ready before the master retries
registering by itself 5-15 s later), and ``start`` returns once the master's web UI JSON
(``/json/``) says ``ALIVE`` at the URL we gave it and lists our worker (by its port) as ``ALIVE``.

Both daemons run with ``spark.port.maxRetries=0``: a port taken between choosing it and binding
it makes the daemon exit (instead of silently moving to the next port, where nobody would look
for it). A daemon that exits during start-up is started again on fresh ports, up to
``START_ATTEMPTS`` times (a new master also means a new worker: the old one has the old URL);
the REST submission server (fixed port 6066) is off. Liveness is judged by the process itself
(its exit status, or for a process started elsewhere its kernel start time from
``/proc/<pid>/stat``), never by ``/proc/<pid>/cmdline``: that reads empty while a process
execs (``spark-class`` execs ``env``, ``bash`` then ``java``), which an earlier version mistook
for "the worker exited" (and then left that worker running). When a daemon keeps failing, or
the timeout passes, ``start`` stops what it started and raises with the tail of the daemon's
log (``master.log`` / ``worker.log``; each attempt starts with a ``=== attempt`` line).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

HOST = "127.0.0.1"
STATE = "cluster.json"
ROLES = {"master": "org.apache.spark.deploy.master.Master", "worker": "org.apache.spark.deploy.worker.Worker"}
#: Tries per daemon when it exits during start-up (a port taken by someone else, a crash).
START_ATTEMPTS = 3
#: Java system properties for both daemons (see the module docs).
DAEMON_PROPS = "-Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false"
LOG_TAIL_LINES = 40

#: Daemons started by this process, by pid, so they can be reaped (no zombies, no ResourceWarning).
_children: dict[int, subprocess.Popen] = {}


class ClusterStartError(RuntimeError):
    """A daemon did not come up; the message names it and carries the tail of its log."""


def spark_home() -> Path:
    """The Spark distribution bundled with the installed pyspark package."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _two_ports() -> tuple[int, int]:
    """Two distinct free ports (RPC, web UI)."""
    a, b = _free_port(), _free_port()
    for _ in range(10):
        if b != a:
            break
        b = _free_port()
    return a, b


def _python() -> str:
    """The interpreter executors' Python workers should run: the venv's (has txn, pyarrow, the jobs)."""
    return os.environ.get("PYSPARK_PYTHON") or sys.executable


def _env(d: Path) -> dict[str, str]:
    home = spark_home()
    conf = d / "conf"  # empty: no spark-env.sh / spark-defaults.conf of another install leaks in
    conf.mkdir(exist_ok=True)
    (d / "local").mkdir(exist_ok=True)
    env = dict(
        os.environ, SPARK_HOME=str(home), SPARK_CONF_DIR=str(conf), PYSPARK_PYTHON=_python(), SPARK_LOCAL_IP=HOST,
        SPARK_LOCAL_HOSTNAME=HOST, SPARK_LOG_DIR=str(d), SPARK_WORKER_DIR=str(d / "work"),
        SPARK_LOCAL_DIRS=str(d / "local"), SPARK_PID_DIR=str(d), SPARK_NO_DAEMONIZE="1",
    )
    for var in ("SPARK_MASTER_OPTS", "SPARK_WORKER_OPTS"):
        env[var] = f"{os.environ.get(var, '')} {DAEMON_PROPS}".strip()
    return env


def _start_time(pid: int) -> int | None:
    """The kernel start time of ``pid`` (clock ticks since boot); None if gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 3, starttime field 22
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _alive(pid: int, role: str, start_time: int | None = None) -> bool:
    """True if ``pid`` is still the Spark ``role`` process we started (guards against pid reuse).

    With ``start_time`` (recorded at spawn) the identity check is exact. Without it (state from
    an older version), the command line must name the role; it reads empty while the process
    execs, so an empty one is read again rather than taken for "exited".
    """
    p = _children.get(pid)
    if p is not None and p.poll() is not None:
        return False
    now = _start_time(pid)
    if now is None:
        return False
    if start_time is not None:
        return now == start_time
    for _ in range(20):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        if cmdline:
            return ROLES[role].encode() in cmdline
        time.sleep(0.05)
    return _start_time(pid) is not None


def _spawn(d: Path, role: str, args: list[str], env: dict[str, str], attempt: int) -> tuple[int, int | None]:
    """Start ``role`` in its own session, output appended to ``<role>.log``; ``(pid, start time)``."""
    cmd = [str(spark_home() / "bin" / "spark-class"), ROLES[role], *args]
    log = open(d / f"{role}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        log.write(f"=== attempt {attempt} {time.strftime('%H:%M:%S')}: {' '.join(cmd)}\n".encode())
        log.flush()
        p = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=str(d))
    finally:
        log.close()
    _children[p.pid] = p
    (d / f"{role}.pid").write_text(f"{p.pid}\n")
    return p.pid, _start_time(p.pid)


def _log_tail(d: Path, role: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of the current attempt in ``<role>.log``."""
    try:
        text = (d / f"{role}.log").read_text(errors="replace")
    except OSError:
        return "(no log)"
    text = text[text.rfind("=== attempt"):] if "=== attempt" in text else text
    return "\n".join(text.splitlines()[-lines:])


def _exit_code(pid: int) -> int | None:
    p = _children.get(pid)
    return None if p is None else p.poll()


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1.0):
            return True
    except OSError:
        return False


def _fetch_json(web_url: str, timeout: float = 2.0) -> dict:
    with urllib.request.urlopen(f"{web_url}/json/", timeout=timeout) as r:  # noqa: S310 - loopback http
        return json.loads(r.read())


def _master_info(web_url: str) -> dict | None:
    try:
        return _fetch_json(web_url)
    except (OSError, ValueError):
        return None


def _read_state(d: Path) -> dict | None:
    try:
        return json.loads((d / STATE).read_text())
    except (OSError, ValueError):
        return None


def _write_state(d: Path, state: dict) -> None:
    tmp = d / (STATE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(d / STATE)


def cluster_status(dir: str | os.PathLike) -> dict:
    """``{"running": bool, "master_url", "web_url", "workers": [{"id", "state", "cores", "memory"}], ...}``."""
    d = Path(dir)
    st = _read_state(d)
    if not st or "web_url" not in st:
        return {"running": False}
    out = dict(st, running=False, workers=[])
    info = _master_info(st["web_url"])
    if info is None:
        return out
    out["master_status"] = info.get("status")
    out["workers"] = [{k: w.get(k) for k in ("id", "host", "port", "state", "cores", "memory", "coresused")}
                      for w in info.get("workers", [])]
    out["running"] = info.get("status") == "ALIVE" and any(w["state"] == "ALIVE" for w in out["workers"])
    return out


def _ready(state: dict) -> bool:
    """The master answers on its web UI as ALIVE at the URL we gave it, listing our worker as ALIVE."""
    info = _master_info(state["web_url"])
    if info is None or info.get("status") != "ALIVE" or info.get("url") != state["master_url"]:
        return False
    return any(w.get("port") == state["worker_port"] and w.get("state") == "ALIVE" for w in info.get("workers", []))


def _kill(pid: int, role: str, start: int | None) -> None:
    """SIGKILL a daemon's process group (if it is still the daemon we started) and reap it."""
    if _alive(pid, role, start):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _reap(pid, block=True)


def start_cluster(dir: str | os.PathLike, *, cores: int = 1, memory: str = "1g", timeout: float = 120.0) -> str:
    """Start master + one worker on 127.0.0.1, wait until the worker is ALIVE, return ``spark://host:port``."""
    d = Path(dir).resolve()
    d.mkdir(parents=True, exist_ok=True)
    (d / "work").mkdir(exist_ok=True)
    st = cluster_status(d)
    if st.get("running"):
        return st["master_url"]
    if _read_state(d):
        stop_cluster(d)  # stale state from a dead or half-started cluster
    env = _env(d)
    deadline = time.monotonic() + timeout
    state: dict = {"dir": str(d), "spark_home": str(spark_home()), "pyspark_python": env["PYSPARK_PYTHON"],
                   "pids": {}, "start_times": {}}
    attempts = {"master": 0, "worker": 0}
    exits: dict[str, list[str]] = {"master": [], "worker": []}

    def launch(role: str) -> None:
        attempts[role] += 1
        port, web_port = _two_ports()
        if role == "master":
            state["master_url"], state["web_url"] = f"spark://{HOST}:{port}", f"http://{HOST}:{web_port}"
            args = ["--host", HOST, "--port", str(port), "--webui-port", str(web_port)]
        else:
            state["worker_port"] = port
            args = ["--host", HOST, "--port", str(port), "--webui-port", str(web_port), "--cores", str(cores),
                    "--memory", memory, "--work-dir", str(d / "work"), state["master_url"]]
        state["pids"][role], state["start_times"][role] = _spawn(d, role, args, env, attempts[role])
        _write_state(d, state)

    def exited(role: str) -> None:
        """``role`` is gone: note how, give up after START_ATTEMPTS."""
        pid = state["pids"][role]
        exits[role].append(f"attempt {attempts[role]}: exit code {_exit_code(pid)}")
        _reap(pid, block=True)
        if attempts[role] >= START_ATTEMPTS or time.monotonic() >= deadline:
            raise ClusterStartError(f"spark {role} exited during start-up ({'; '.join(exits[role])}); last lines "
                                    f"of {d / (role + '.log')}:\n{_log_tail(d, role)}")

    try:
        launch("master")
        launch("worker")  # at once: its JVM starts while the master's does; it retries registering if early
        while not _ready(state):
            if not _alive(state["pids"]["master"], "master", state["start_times"]["master"]):
                exited("master")
                _kill(state["pids"]["worker"], "worker", state["start_times"]["worker"])  # it has the old URL
                launch("master")
                launch("worker")
            elif not _alive(state["pids"]["worker"], "worker", state["start_times"]["worker"]):
                exited("worker")
                launch("worker")
            elif time.monotonic() >= deadline:
                raise TimeoutError(f"spark cluster not ready after {timeout:.0f}s; last lines of {d / 'master.log'}:\n"
                                   f"{_log_tail(d, 'master', 15)}\nlast lines of {d / 'worker.log'}:\n"
                                   f"{_log_tail(d, 'worker', 15)}")
            time.sleep(0.25)
    except BaseException:
        stop_cluster(d)
        raise
    return state["master_url"]


def stop_cluster(dir: str | os.PathLike, timeout: float = 30.0) -> None:
    """Stop the worker (and its executors) then the master started in ``dir``; idempotent."""
    d = Path(dir)
    st = _read_state(d) or {}
    pids, starts = st.get("pids", {}), st.get("start_times", {})
    for role in ("worker", "master"):
        pid = pids.get(role)
        if pid is None:
            pf = d / f"{role}.pid"
            pid = int(pf.read_text()) if pf.exists() else None
        if pid is None:
            continue
        start = starts.get(role)
        if not _alive(pid, role, start):
            _reap(pid)
            continue
        # Each daemon was started in its own session (pgid == pid); the group also holds its executors.
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + timeout
        while _alive(pid, role, start) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.2)
        if _alive(pid, role, start):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(pid, block=True)
    for name in (STATE, "master.pid", "worker.pid"):
        (d / name).unlink(missing_ok=True)


def _reap(pid: int, block: bool = False) -> None:
    """Collect the exit status of a daemon this process started (no-op for others)."""
    p = _children.get(pid)
    if p is None:
        return
    try:
        if block:
            p.wait(timeout=10)
        elif p.poll() is None:
            return
    except subprocess.TimeoutExpired:
        return
    _children.pop(pid, None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["start", "stop", "status"])
    p.add_argument("--dir", required=True, help="logs, pid files, worker scratch and cluster.json")
    p.add_argument("--cores", type=int, default=1, help="worker cores (default 1)")
    p.add_argument("--memory", default="1g", help="worker memory (default 1g)")
    p.add_argument("--timeout", type=float, default=120, help="seconds to wait for the worker to be ALIVE")
    p.add_argument("--json", action="store_true", help="status as JSON")
    a = p.parse_args(argv)
    if a.action == "start":
        try:
            print(start_cluster(a.dir, cores=a.cores, memory=a.memory, timeout=a.timeout))
        except (ClusterStartError, TimeoutError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        return 0
    if a.action == "stop":
        stop_cluster(a.dir)
        return 0
    st = cluster_status(a.dir)
    if a.json:
        print(json.dumps(st, indent=2))
    elif st["running"]:
        workers = ", ".join(f"{w['id']} {w['state']} {w['cores']} cores {w['memory']} MB" for w in st["workers"])
        print(f"running: {st['master_url']} (ui {st['web_url']}); workers: {workers}")
    else:
        print("not running")
    return 0 if st["running"] else 1


if __name__ == "__main__":
    sys.exit(main())
