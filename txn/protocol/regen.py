"""Regenerate ``pulsar_wire_pb2.py`` from ``pulsar_wire.proto`` (dev tool).

Run ``python -m txn.protocol.regen``; it needs the ``grpcio-tools`` dev extra,
which bundles ``protoc``. The generated module is committed so that users need
only the ``protobuf`` runtime.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> int:
    from grpc_tools import protoc  # dev-only dependency

    here = Path(__file__).resolve().parent
    rc = protoc.main(["protoc", f"-I{here}", f"--python_out={here}", str(here / "pulsar_wire.proto")])
    if rc == 0:
        print(f"wrote {here / 'pulsar_wire_pb2.py'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
