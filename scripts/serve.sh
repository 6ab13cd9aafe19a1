#!/usr/bin/env bash
# Starts vpsshop as a sandbox (SQLite in ./vpsshop.db, test networks, fixed rates) on a fresh machine.
#   ./scripts/serve.sh [vpsshop serve arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null; else sudo apt-get install -y python3-venv; fi
fi
if [ ! -x .venv/bin/vpsshop ] || [ pyproject.toml -nt .venv/.vpsshop-serve ]; then
    python3 -m venv .venv
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -c constraints.txt -e .
    touch .venv/.vpsshop-serve
fi
exec .venv/bin/vpsshop serve "$@"
