#!/usr/bin/env bash
# Idempotent set-up of everything the project needs on a fresh Debian machine:
# Debian packages, the project virtualenv (.venv) with the package and its extras,
# and the Apache Pulsar distribution (fetched from Maven Central into the cache).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[bootstrap] %s\n' "$*"; }

# 1. Debian packages (only what is missing).
need=()
command -v java >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || need+=(maven)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)   # real PostgreSQL for the tests
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
command -v chromium >/dev/null 2>&1 || need+=(chromium)   # headless browser for the dashboard test
# A C compiler and the Python headers build txn's compiled hot path (txn/protocol/_speedups.c).
command -v gcc >/dev/null 2>&1 || need+=(gcc)
python3 -c 'import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
  2>/dev/null || need+=(python3-dev)
if ((${#need[@]})); then
  log "installing Debian packages: ${need[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

python3 - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"Python >= 3.11 is required, found {sys.version.split()[0]}")
PY

# 2. The virtualenv, reinstalled only when pyproject.toml changes.
if [ ! -x .venv/bin/python ]; then
  log "creating .venv"
  python3 -m venv .venv
fi
stamp=".venv/.installed-$(cat pyproject.toml setup.py txn/protocol/_speedups.c | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  log "installing Python packages into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[dev,api,spark,demo]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi

.venv/bin/python -c 'from txn.protocol.batch import COMPILED; import sys; sys.exit(not COMPILED)' \
  || log "WARNING: the compiled hot path (txn/protocol/_speedups.c) was not built; running on the pure Python path"

# 3. The Pulsar distribution (cached outside the repo; instant when present).
.venv/bin/python -c 'from txn_shell.localbroker import ensure_distribution; ensure_distribution()'
log "ready"
