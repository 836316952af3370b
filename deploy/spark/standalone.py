"""Start, stop or inspect a throwaway Spark standalone cluster (one master + one worker) on 127.0.0.1.

Uses the Spark that ships inside the installed ``pyspark`` package (``SPARK_HOME`` = the package
dir, ``bin/spark-class``), so nothing beyond the venv and a Java 17 runtime is needed. Everything
binds to loopback on free ports; logs, pid files, the worker's scratch dir and ``cluster.json``
(master URL, web UI URL, pids) live in ``--dir``.

    python deploy/spark/standalone.py start  --dir D [--cores 1] [--memory 1g]   # prints the master URL
    python deploy/spark/standalone.py status --dir D [--json]
    python deploy/spark/standalone.py stop   --dir D

Importable too: ``start_cluster(dir) -> master_url``, ``cluster_status(dir) -> dict``,
``stop_cluster(dir)``. ``start`` returns once the master's web UI JSON (``/json/``) lists the
worker as ALIVE; the processes run in their own session and outlive the caller until ``stop``.
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


def spark_home() -> Path:
    """The Spark distribution bundled with the installed pyspark package."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _python() -> str:
    """The interpreter executors' Python workers should run: the venv's (has txn, pyarrow, the jobs)."""
    return os.environ.get("PYSPARK_PYTHON") or sys.executable


def _env(d: Path) -> dict[str, str]:
    home = spark_home()
    return dict(
        os.environ, SPARK_HOME=str(home), PYSPARK_PYTHON=_python(), SPARK_LOCAL_IP=HOST,
        SPARK_LOCAL_HOSTNAME=HOST, SPARK_LOG_DIR=str(d), SPARK_WORKER_DIR=str(d / "work"),
        SPARK_PID_DIR=str(d), SPARK_NO_DAEMONIZE="1",
    )


def _spawn(d: Path, role: str, args: list[str], env: dict[str, str]) -> int:
    log = open(d / f"{role}.log", "ab")  # noqa: SIM115 - handed to the child
    try:
        p = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), ROLES[role], *args], env=env,
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True, cwd=str(d))
    finally:
        log.close()
    (d / f"{role}.pid").write_text(f"{p.pid}\n")
    return p.pid


def _alive(pid: int, role: str) -> bool:
    """True if ``pid`` is still the Spark ``role`` process we started (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return ROLES[role].encode() in cmdline


def _fetch_json(web_url: str, timeout: float = 2.0) -> dict:
    with urllib.request.urlopen(f"{web_url}/json/", timeout=timeout) as r:  # noqa: S310 - loopback http
        return json.loads(r.read())


def _read_state(d: Path) -> dict | None:
    try:
        return json.loads((d / STATE).read_text())
    except (OSError, ValueError):
        return None


def cluster_status(dir: str | os.PathLike) -> dict:
    """``{"running": bool, "master_url", "web_url", "workers": [{"id", "state", "cores", "memory"}], ...}``."""
    d = Path(dir)
    st = _read_state(d)
    if not st:
        return {"running": False}
    out = dict(st, running=False, workers=[])
    try:
        info = _fetch_json(st["web_url"])
    except OSError:
        return out
    out["master_status"] = info.get("status")
    out["workers"] = [{k: w.get(k) for k in ("id", "host", "state", "cores", "memory", "coresused")}
                      for w in info.get("workers", [])]
    out["running"] = info.get("status") == "ALIVE" and any(w["state"] == "ALIVE" for w in out["workers"])
    return out


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
    port, web_port, worker_port, worker_web = (_free_port() for _ in range(4))
    master_url, web_url = f"spark://{HOST}:{port}", f"http://{HOST}:{web_port}"
    state = {"master_url": master_url, "web_url": web_url, "dir": str(d), "spark_home": str(spark_home()),
             "pyspark_python": env["PYSPARK_PYTHON"], "pids": {}}
    state["pids"]["master"] = _spawn(d, "master", ["--host", HOST, "--port", str(port),
                                                   "--webui-port", str(web_port)], env)
    (d / STATE).write_text(json.dumps(state, indent=2))
    state["pids"]["worker"] = _spawn(d, "worker", [
        "--host", HOST, "--port", str(worker_port), "--webui-port", str(worker_web), "--cores", str(cores),
        "--memory", memory, "--work-dir", str(d / "work"), master_url], env)
    (d / STATE).write_text(json.dumps(state, indent=2))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cluster_status(d).get("running"):
            return master_url
        for role, pid in state["pids"].items():
            if not _alive(pid, role):
                stop_cluster(d)
                raise RuntimeError(f"spark {role} exited during startup; see {d / (role + '.log')}")
        time.sleep(0.5)
    stop_cluster(d)
    raise TimeoutError(f"spark cluster not ready after {timeout:.0f}s; logs in {d}")


def stop_cluster(dir: str | os.PathLike, timeout: float = 30.0) -> None:
    """Stop the worker (and its executors) then the master started in ``dir``; idempotent."""
    d = Path(dir)
    st = _read_state(d) or {}
    pids = st.get("pids", {})
    for role in ("worker", "master"):
        pid = pids.get(role)
        if pid is None:
            pf = d / f"{role}.pid"
            pid = int(pf.read_text()) if pf.exists() else None
        if pid is None or not _alive(pid, role):
            continue
        # Each daemon was started in its own session (pgid == pid); the group also holds its executors.
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        deadline = time.monotonic() + timeout
        while _alive(pid, role) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.2)
        if _alive(pid, role):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap(pid)
    for name in (STATE, "master.pid", "worker.pid"):
        (d / name).unlink(missing_ok=True)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)  # our own child when started from this process
    except ChildProcessError:
        pass


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
        print(start_cluster(a.dir, cores=a.cores, memory=a.memory, timeout=a.timeout))
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
