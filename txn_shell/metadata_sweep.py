"""Delete the ephemeral nodes a killed standalone left in its RocksDB metadata store.

Pulsar's ``RocksdbMetadataStore`` (the standalone's ``--metadata-dir``) has no sessions: an ephemeral
node records the store instance that wrote it, and a later instance deletes such a node lazily, the
first time it reads it. A standalone stopped cleanly releases its own nodes; one killed with SIGKILL
leaves them. The next bookie then finds its old registration ``/ledgers/available/<host:port>``
during its own registration, the lazy delete fires a Deleted notification, and when that
notification reaches the lock manager after the new registration is in place, the bookie's
``ResourceLockImpl`` revalidates the lock. Revalidation compares the stored value with its own with
``equals``, which ``BookieServiceInfo`` (BookKeeper 4.17) does not define, so it deletes and
recreates its own node, whose Deleted notification starts the next revalidation: the bookie
registers and unregisters in a loop for the life of the process (apache/pulsar#25001,
apache/bookkeeper#4686).

:func:`drop_ephemeral_nodes` deletes every ephemeral node of a metadata store that no process has
open. With nothing running every such node is stale (the store itself would treat each one as
absent), so the next standalone starts as if the sessions of the killed one had expired. It runs a
small Java program against the ``rocksdbjni`` jar of the distribution (compiled once with the JDK's
``javac``, then well under a second a run).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["SweepError", "drop_ephemeral_nodes", "java_command"]


class SweepError(RuntimeError):
    """The metadata store could not be swept."""


# A value of the store is a header and the node's data. Header (big-endian): int header size,
# int format version (1), long version, long owner instance, long created, long modified,
# byte ephemeral; fields are only ever appended, and the header size says where the data starts.
# The store's own keys (instance id, sequential id) hold a bare long and are left alone.
_CLASS = "DropEphemeralNodes"
_SOURCE = """\
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import org.rocksdb.Options;
import org.rocksdb.RocksDB;
import org.rocksdb.RocksIterator;
import org.rocksdb.WriteBatch;
import org.rocksdb.WriteOptions;

public class DropEphemeralNodes {
    private static final int EPHEMERAL_OFFSET = 40;

    public static void main(String[] args) throws Exception {
        RocksDB.loadLibrary();
        try (Options options = new Options().setCreateIfMissing(false);
             RocksDB db = RocksDB.open(options, args[0]);
             WriteBatch batch = new WriteBatch();
             WriteOptions sync = new WriteOptions().setSync(true)) {
            int dropped = 0;
            try (RocksIterator it = db.newIterator()) {
                for (it.seekToFirst(); it.isValid(); it.next()) {
                    if (isEphemeral(it.value())) {
                        batch.delete(it.key());
                        System.out.println(new String(it.key(), StandardCharsets.UTF_8));
                        dropped++;
                    }
                }
            }
            if (dropped > 0) {
                db.write(sync, batch);
            }
        }
    }

    private static boolean isEphemeral(byte[] value) {
        if (value.length <= EPHEMERAL_OFFSET) {
            return false;
        }
        ByteBuffer header = ByteBuffer.wrap(value);
        int headerSize = header.getInt(0);
        int format = header.getInt(4);
        return format >= 1 && headerSize > EPHEMERAL_OFFSET && headerSize <= value.length
                && value[EPHEMERAL_OFFSET] != 0;
    }
}
"""


def java_command() -> str | None:
    """``$JAVA_HOME/bin/java`` if set (as ``bin/pulsar`` picks it), else ``java`` on PATH, else None."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    return shutil.which("java")


def _compiled(java: str, classpath: str, tools_dir: Path) -> Path | None:
    """A directory holding the compiled program (compiled once per source, by the JDK's javac), or
    None without javac. Starting the compiled class takes well under a second; the source launcher
    compiles on every run (2-4 s on a busy machine)."""
    target = tools_dir / f"drop-ephemeral-{hashlib.sha256(_SOURCE.encode()).hexdigest()[:12]}"
    if (target / f"{_CLASS}.class").exists():
        return target
    javac = Path(java).resolve().parent / "javac"
    if not javac.exists():
        return None
    tools_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".compile-", dir=tools_dir))
    try:
        (tmp / f"{_CLASS}.java").write_text(_SOURCE)
        res = subprocess.run([str(javac), "-cp", classpath, "-d", str(tmp), str(tmp / f"{_CLASS}.java")],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise SweepError(f"javac failed: {res.stderr.strip()[-2000:]}")
        with contextlib.suppress(OSError):  # another process may have won the race: use its copy
            tmp.rename(target)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SweepError(f"compiling the metadata sweep failed: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def drop_ephemeral_nodes(pulsar_home: Path, metadata_dir: Path, tools_dir: Path, timeout: float = 120) -> list[str]:
    """Delete every ephemeral node of the RocksDB metadata store in ``metadata_dir``; return their paths.

    No process may have the store open (RocksDB's lock refuses a second opener). A missing store
    has nothing to sweep. The compiled program is kept under ``tools_dir``. Raises SweepError if
    Java or the distribution's ``rocksdbjni`` jar is missing, or the program fails.
    """
    if not (metadata_dir / "CURRENT").exists():
        return []
    java = java_command()
    if java is None:
        raise SweepError("java not found (JAVA_HOME/bin/java or PATH)")
    jars = sorted((pulsar_home / "lib").glob("org.rocksdb-rocksdbjni-*.jar"))
    if not jars:
        raise SweepError(f"no org.rocksdb-rocksdbjni-*.jar in {pulsar_home / 'lib'}")
    jar = str(jars[-1])
    compiled = _compiled(java, jar, tools_dir)
    # RocksDB's native library is unpacked into java.io.tmpdir: a private one, removed afterwards.
    with tempfile.TemporaryDirectory(prefix="pulsar-txn-sweep-") as tmp:
        if compiled is not None:
            program = ["-cp", f"{jar}{os.pathsep}{compiled}", _CLASS]
        else:  # a JDK without javac (unusual): the source launcher
            source = Path(tmp) / f"{_CLASS}.java"
            source.write_text(_SOURCE)
            program = ["-cp", jar, str(source)]
        cmd = [java, "-Xmx64m", "-XX:TieredStopAtLevel=1", f"-Djava.io.tmpdir={tmp}", *program, str(metadata_dir)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise SweepError(f"sweeping {metadata_dir} failed: {e}") from e
    if res.returncode != 0:
        raise SweepError(f"sweeping {metadata_dir} failed (exit {res.returncode}): {res.stderr.strip()[-2000:]}")
    return res.stdout.splitlines()
