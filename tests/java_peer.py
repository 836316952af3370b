"""Java-client peers for interop tests: a one-file Java program compiled against the Pulsar
distribution's jars (the broker's own, fetched by ``txn_shell.localbroker``) and run as a process."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from txn_shell.localbroker import ensure_distribution

JAVA_DIR = Path(__file__).resolve().parent / "java"


@contextmanager
def compiled_peer(name: str) -> Iterator[list[str]]:
    """Compile ``tests/java/<name>.java`` once; yield the command (less its arguments) running it."""
    java, javac = shutil.which("java"), shutil.which("javac")
    assert java and javac, "the Java peer needs a JDK (java and javac on PATH)"
    lib = ensure_distribution(progress=lambda _: None) / "lib"
    assert sorted(lib.glob("org.apache.pulsar-pulsar-client-api-*.jar")), f"no pulsar-client-api jar in {lib}"
    workdir = tempfile.mkdtemp(prefix=f"txn-{name.lower()}-")
    try:
        subprocess.run([javac, "-d", workdir, "-cp", f"{lib}/*", str(JAVA_DIR / f"{name}.java")], check=True,
                       capture_output=True, text=True, timeout=120)
        yield [java, "-Djava.net.preferIPv4Stack=true", "-cp", f"{workdir}:{lib}/*", name]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_peer(cmd: list[str], *args: str, stdin: str | None = None, timeout: float = 120) -> str:
    """Run the peer to its end; its stdout (it must exit 0)."""
    proc = subprocess.run([*cmd, *args], input=stdin, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout
