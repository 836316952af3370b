"""What else is running on the benchmark machine (it skews every absolute number)."""

from __future__ import annotations

import os
from pathlib import Path


def machine_load(own_broker_pid: int | None) -> str:
    """CPU count, load average, and how many other Pulsar standalone JVMs are running.

    With ``own_broker_pid`` None (a broker given by URL) the broker under test may be one of
    the JVMs found, so one is not counted.
    """
    parts = [f"{os.cpu_count()} CPUs", "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())]
    brokers = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == own_broker_pid:
            continue
        try:
            if b"PulsarStandaloneStarter" in (d / "cmdline").read_bytes():
                brokers += 1
        except OSError:
            continue
    others = brokers if own_broker_pid else max(brokers - 1, 0)
    if others:
        parts.append(f"WARNING: {others} other Pulsar broker JVM(s) running on this machine; figures will be noisy")
    return "; ".join(parts)


def proc_cpu_s(pid: int | None) -> float | None:
    """User+system CPU seconds of process ``pid`` (all its threads; Linux ``/proc``), or None
    (no pid, or the process is gone)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
