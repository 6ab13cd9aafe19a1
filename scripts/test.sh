#!/usr/bin/env bash
# Runs the whole vpsshop test suite on a fresh Debian 12 machine (as root) or a developer's box.
#
#   ./scripts/test.sh [pytest arguments]
#
# 1. installs the Debian and npm packages listed in scripts/deps/apt-*.txt and npm-*.txt;
# 2. makes .venv and installs vpsshop with its test extras, pinned by constraints.txt;
# 3. makes sure PostgreSQL answers on 127.0.0.1:5432 with a database `test` (installs and starts
#    one when none answers);
# 4. runs pytest (the whole suite in two processes side by side: see run_lanes). The tests start the
#    other peers (chain nodes, libvirtd, anvil) themselves.
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

# The whole suite (no arguments) runs in two pytest processes side by side, one per core: the files
# below (QEMU guests under TCG, libvirtd hosts, the contract kit run as plugin authors run it: about a
# third of the suite's time, measured with the --durations each lane prints) and everything else. The second lane has a PostgreSQL database of its own (the first one's name with
# "_lane2"), and the system libvirtd both lanes share is started before either (and stopped after both
# when it was started here), so neither lane's session starts or stops it under the other.
# VPSSHOP_TEST_LANES=1 runs one process; any pytest argument runs exactly what it asks, in one.
SECOND_LANE=(
    tests/test_real_guest.py
    tests/test_real_guest_firewall.py
    tests/test_real_guest_migrate.py
    tests/test_real_guest_traffic.py
    tests/test_migrate.py
    tests/test_images.py
    tests/test_console_hosts.py
    tests/test_libvirt.py
    tests/test_hypervisor_kit_catches.py
    tests/test_plugin_author_path.py
    tests/test_admin.py
)

second_lane_url() {  # the first lane's database URL with "_lane2" after the name; created when missing
    .venv/bin/python - "${VPSSHOP_TEST_PG_URL:-postgresql+psycopg://postgres@127.0.0.1:5432/test}" <<'PY'
import sys

import sqlalchemy as sa

url = sa.make_url(sys.argv[1])
lane = url.set(database=f"{url.database}_lane2")
engine = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
with engine.connect() as conn:
    if not conn.scalar(sa.text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": lane.database}):
        conn.execute(sa.text(f'CREATE DATABASE "{lane.database}"'))
engine.dispose()
print(lane.render_as_string(hide_password=False))
PY
}

start_libvirtd() {  # prints the PIDs of the daemons started here (none when libvirtd already answers)
    .venv/bin/python - <<'PY'
import sys

sys.path.insert(0, "tests")
import libvirt
import libvirt_peer

libvirt.registerErrorHandler(lambda _c, _e: None, None)
print(" ".join(str(pid) for pid in libvirt_peer.system_libvirtd()))
PY
}

run_lanes() {
    local lane2_url started ignores=() status1 status2 log2 pid2 f
    lane2_url=$(second_lane_url) || return 1
    started=$(start_libvirtd) || return 1
    for f in "${SECOND_LANE[@]}"; do ignores+=("--ignore=$f"); done
    log2=$(mktemp /tmp/vpsshop-lane2-XXXXXX.log)
    log "running the test suite in two lanes (lane 2: ${SECOND_LANE[*]}; its output follows lane 1's)"
    VPSSHOP_TEST_PG_URL=$lane2_url .venv/bin/python -m pytest --durations=15 "${SECOND_LANE[@]}" >"$log2" 2>&1 &
    pid2=$!
    trap 'kill "$pid2" 2>/dev/null' EXIT                       # the run cut short (a timeout, ^C)
    trap 'kill "$pid2" 2>/dev/null; exit 130' INT TERM          # takes lane 2 with it
    .venv/bin/python -m pytest --durations=25 "${ignores[@]}"
    status1=$?
    wait "$pid2"
    status2=$?
    trap - EXIT INT TERM
    log "lane 2 (${SECOND_LANE[*]}), exit status $status2"
    cat "$log2"
    rm -f "$log2"
    # shellcheck disable=SC2086
    [ -z "$started" ] || kill $started 2>/dev/null || true
    log "lane 1 exit status $status1, lane 2 exit status $status2"
    for status in $status1 $status2; do
        [ "$status" = 5 ] && { echo "no tests were collected" >&2; return 1; }
        [ "$status" = 0 ] || return "$status"
    done
    return 0
}

install_apt
install_npm
install_python
ensure_postgres
set +e
if [ $# -eq 0 ] && [ "${VPSSHOP_TEST_LANES:-2}" = 2 ]; then
    run_lanes
    status=$?
else
    log "running the test suite"
    .venv/bin/python -m pytest "$@"
    status=$?
    [ $status = 5 ] && { echo "no tests were collected" >&2; status=1; }
fi
set -e
exit $status
