#!/usr/bin/env bash
# Runs the whole vpsshop test suite on a fresh Debian 12 machine (as root) or a developer's box.
#
#   ./scripts/test.sh [pytest arguments]
#
# 1. installs the Debian and npm packages listed in scripts/deps/apt-*.txt and npm-*.txt;
# 2. makes .venv and installs vpsshop with its test extras, pinned by constraints.txt;
# 3. makes sure PostgreSQL answers on 127.0.0.1:5432 with a database `test` (installs and starts
#    one when none answers);
# 4. runs pytest. The tests start the other peers (chain nodes, libvirtd, anvil) themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

log() { printf '\n==> %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

deps_wanted() {  # the packages listed in scripts/deps/$1-*.txt, one per line, comments stripped
    local f
    for f in scripts/deps/"$1"-*.txt; do
        if [ -f "$f" ]; then sed 's/#.*//' "$f"; fi
    done | tr -s ' \t\n' '\n' | { grep -v '^$' || true; } | sort -u
}
apt_wanted() { deps_wanted apt; }
npm_wanted() { deps_wanted npm; }

install_apt() {
    local missing=()
    for pkg in $(apt_wanted); do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "installing Debian packages: ${missing[*]}"
        as_root apt-get update -qq
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

install_npm() {
    local wanted
    wanted=$(npm_wanted)
    [ -n "$wanted" ] || return 0
    if ! command -v npm >/dev/null; then
        log "installing Node.js and npm"
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq nodejs npm >/dev/null
    fi
    mkdir -p .peers/npm
    local need=0
    local pkg name
    for pkg in $wanted; do
        case $pkg in  # strip a version: @scope/name@1.2 -> @scope/name, name@1.2 -> name
            @*) name="@$(printf '%s' "${pkg#@}" | cut -d@ -f1)" ;;
            *) name=${pkg%%@*} ;;
        esac
        [ -d ".peers/npm/node_modules/$name" ] || need=1
    done
    # an install cut short leaves the packages without node_modules/.bin: only a finished one writes the stamp
    local stamp=.peers/npm/.vpsshop-installed
    [ -f $stamp ] && [ "$(cat $stamp)" = "$wanted" ] || need=1
    if [ $need = 1 ]; then
        log "installing npm packages: $wanted"
        local try
        for try in 1 2; do  # a registry download that stalls has hung npm for good: cut it, try once more
            if (cd .peers/npm && { [ -f package.json ] || echo '{"private":true}' > package.json; } &&
                timeout 900 npm install --no-audit --no-fund --silent $wanted); then
                printf '%s' "$wanted" > $stamp
                break
            fi
            [ $try = 2 ] && { log "npm install failed twice"; return 1; }
            log "npm install failed or stalled; trying again"
        done
    fi
    export PATH="$ROOT/.peers/npm/node_modules/.bin:$PATH"
}

install_python() {
    if [ ! -x .venv/bin/python ]; then
        log "creating .venv"
        python3 -m venv .venv
    fi
    local stamp=.venv/.vpsshop-installed
    if [ ! -f $stamp ] || [ pyproject.toml -nt $stamp ] || [ constraints.txt -nt $stamp ]; then
        log "installing vpsshop and its test dependencies into .venv"
        .venv/bin/pip install -q --upgrade pip
        .venv/bin/pip install -q -c constraints.txt -e '.[test]'
        # the x402 sign-in-with-x client formats its EIP-4361 messages with signinwithethereum, whose
        # metadata still caps eth-account below the 0.14 we pin (it works with it): installed on its own
        # (the shop itself verifies the messages without it, see vpsshop/wallets.py)
        .venv/bin/pip install -q --no-deps -c constraints.txt signinwithethereum
        touch $stamp
    fi
}

pg_answers() { python3 - <<'PY'
import socket, sys
s = socket.socket(); s.settimeout(1)
try:
    s.connect(("127.0.0.1", 5432))
except OSError:
    sys.exit(1)
PY
}

ensure_postgres() {
    if [ -n "${VPSSHOP_TEST_PG_URL:-}" ]; then return 0; fi
    if ! pg_answers; then
        if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
            log "installing PostgreSQL"
            as_root apt-get update -qq
            DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq postgresql >/dev/null
        fi
        local version
        version=$(ls /etc/postgresql | sort -V | tail -n 1)
        # Local test server: trust connections from loopback only.
        as_root sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/' "/etc/postgresql/$version/main/pg_hba.conf"
        log "starting PostgreSQL $version"
        as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || as_root pg_ctlcluster "$version" main start
        for _ in $(seq 30); do pg_answers && break; sleep 1; done
    fi
    if ! psql -h 127.0.0.1 -U postgres -d test -c 'select 1' >/dev/null 2>&1; then
        log "creating database test"
        psql -h 127.0.0.1 -U postgres -d postgres -c 'CREATE DATABASE test' >/dev/null 2>&1 \
            || as_root su postgres -c "psql -c 'CREATE DATABASE test'" >/dev/null
    fi
}

install_apt
install_npm
install_python
ensure_postgres
log "running the test suite"
set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
[ $status = 5 ] && { echo "no tests were collected" >&2; exit 1; }
exit $status
