"""The reference deployment of vpsshop: a whole shop on real local peers, supervised by supervisord.

    ./up      # install, start and initialise every peer, then vpsshop (two API processes, the
              # operators' console, one worker) and an operator of the console
    ./walk    # a customer's way through the shop, step by step, against the running deployment
    ./down    # stop and remove everything `up` made; checks that nothing it started still runs

vpsshop's own processes are the programs of ``supervisor/vpsshop.conf`` beside this file, installed
as a reseller installs them (user ``vpsshop``), with only its paths and ports replaced
(:func:`render_units`).

`up`, `walk` and `down` run this file. It uses the standard library until the deployment's virtualenv
exists; the steps that need vpsshop's dependencies (psycopg, web3, the x402 client) run again under
that virtualenv's Python. README.md beside this file lists every setting (environment variables
named ``REFDEPLOY_*``); every port and path is one of them, so two deployments run side by side.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from decimal import Decimal
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CONTRACT = ROOT / "tests" / "contracts" / "TestUSDC.sol"  # Solidity source, compiled here (not imported)
CHAIN_ID = 8453
LTC_USD, XMR_USD = "80", "150"
APT_FILE = HERE / "apt.txt"
UNITS = HERE / "supervisor" / "vpsshop.conf"  # the file docs/operations.md tells a reseller to install
SERVICE_USER = "vpsshop"  # the user= of its programs
LIBVIRT_SOCKET = "/var/run/libvirt/libvirt-sock"
GUEST_IMAGE = "debian-12-test.raw"  # REFDEPLOY_REAL_GUEST: scripts/build-test-guest.sh's Debian guest
NPM_PACKAGES = ("@foundry-rs/anvil", "solc")
PORT_NAMES = (
    "https",
    "api1",
    "api2",
    "console_https",
    "console_api",
    "console",
    "prometheus",
    "anvil",
    "ltc_rpc",
    "ltc_p2p",
    "xmr_rpc",
    "xmr_p2p",
    "xmr_zmq",
    "xmr_sender",
    "xmr_shop",
)


# ---- settings -------------------------------------------------------------------------------------


def env(name: str, default: str) -> str:
    return os.environ.get(f"REFDEPLOY_{name}", default)


def state_dir() -> Path:
    return Path(env("STATE", "/var/lib/vpsshop-reference")).resolve()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def say(text: str) -> None:
    print(text, flush=True)


def run(*argv: str, check: bool = True, quiet: bool = False, **kw: Any) -> subprocess.CompletedProcess[str]:
    if not quiet:
        say("  $ " + " ".join(argv))
    return subprocess.run(argv, check=check, text=True, capture_output=quiet, **kw)


def load_state() -> dict[str, Any]:
    path = state_dir() / "deployment.json"
    if not path.exists():
        sys.exit(f"no deployment in {state_dir()} (run ./up first, with the same REFDEPLOY_STATE)")
    return json.loads(path.read_text())


def save_state(state: dict[str, Any]) -> None:
    path = state_dir() / "deployment.json"
    path.write_text(json.dumps(state, indent=2))
    path.chmod(0o600)


def wait(what: str, probe: Any, seconds: float = 120) -> Any:
    deadline = time.monotonic() + seconds
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            answer = probe()
            if answer:
                return answer
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            last = exc
        time.sleep(0.5)
    raise SystemExit(f"{what} did not come up within {seconds:.0f} s ({last})")


def _not_above(charged: Any, quoted: Any) -> bool:
    """A charge is what its quote said, or less when paid time went by in between (never more)."""
    return charged is not None and quoted is not None and Decimal(str(charged)) <= Decimal(str(quoted))


def post_json(url: str, body: dict[str, Any], auth: tuple[str, str] | None = None, timeout: float = 120) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:  # JSON-RPC errors come with HTTP 500
        return json.loads(exc.read())


def ltc_rpc(state: dict[str, Any], method: str, *params: Any, wallet: str | None = None) -> Any:
    url = f"http://127.0.0.1:{state['ports']['ltc_rpc']}/" + (f"wallet/{wallet}" if wallet else "")
    body = post_json(
        url, {"jsonrpc": "1.0", "id": 1, "method": method, "params": list(params)}, ("vpsshop", state["ltc_password"])
    )
    if body.get("error"):
        raise RuntimeError(f"litecoind {method}: {body['error']}")
    return body["result"]


def xmr_call(url: str, method: str, **params: Any) -> Any:
    body = post_json(url, {"jsonrpc": "2.0", "id": "0", "method": method, "params": params})
    if "error" in body:
        raise RuntimeError(f"monero {method}: {body['error']}")
    return body.get("result", {})


def xmr_urls(state: dict[str, Any]) -> tuple[str, str, str]:
    p = state["ports"]
    return (
        f"http://127.0.0.1:{p['xmr_rpc']}",
        f"http://127.0.0.1:{p['xmr_sender']}/json_rpc",
        f"http://127.0.0.1:{p['xmr_shop']}/json_rpc",
    )


def supervisorctl(state: dict[str, Any], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("supervisorctl", "-c", state["supervisord_conf"], *args, check=check)


# ---- up: the parts that need only the standard library ---------------------------------------------


def running_services() -> set[str]:
    """The services whose init script says they run (``service --status-all`` marks them ``[ + ]``;
    where systemd runs, the scripts ask it)."""
    listed = subprocess.run(["service", "--status-all"], capture_output=True, text=True, check=False).stdout
    return {line.split("]", 1)[1].strip() for line in listed.splitlines() if line.strip().startswith("[ + ]")}


def install_system_packages() -> list[str]:
    """apt-get the packages of apt.txt; the services that installing them started (Debian starts a
    package's service when it is installed: nginx on port 80, prometheus on 9090, the PostgreSQL
    cluster, supervisor...), which ``down`` stops again."""
    if env("SKIP_APT", "") == "1":
        say("- Debian packages: skipped (REFDEPLOY_SKIP_APT=1)")
        return []
    before = running_services()
    packages = [line.split("#")[0].strip() for line in APT_FILE.read_text().splitlines() if line.split("#")[0].strip()]
    if shutil.which("npm") is None:  # Debian's npm; NodeSource's nodejs brings its own and conflicts with it
        packages.append("npm")
    say("- Debian packages")
    run("apt-get", "update", "-q")
    run(
        "apt-get",
        "install",
        "-y",
        "-q",
        "--no-install-recommends",
        *packages,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    started = sorted(running_services() - before)
    if started:
        say(f"- services the packages started (./down stops them): {', '.join(started)}")
    return started


def make_venv(state_root: Path) -> Path:
    given = env("VENV", "")
    if given:
        say(f"- virtualenv: {given} (REFDEPLOY_VENV)")
        return Path(given)
    venv = state_root / "venv"
    if not (venv / "bin" / "vpsshop").exists():
        say("- virtualenv with vpsshop[libvirt] from this checkout")
        # Debian's python3 (python3-venv): an interpreter elsewhere (pyenv's under /root) may be out
        # of reach of user vpsshop, which runs the programs
        python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
        run(python, "-m", "venv", str(venv))
        run(str(venv / "bin" / "pip"), "install", "-q", "-c", str(ROOT / "constraints.txt"), f"{ROOT}[libvirt]")
    return venv


def npm_bin(state_root: Path) -> Path:
    given = env("NPM_DIR", "")
    npm_dir = Path(given) if given else state_root / "npm"
    bin_dir = npm_dir / "node_modules" / ".bin"
    if not all((bin_dir / name).exists() for name in ("anvil", "solcjs")):
        say("- anvil and solcjs from npm")
        npm_dir.mkdir(parents=True, exist_ok=True)
        if not (npm_dir / "package.json").exists():
            (npm_dir / "package.json").write_text('{"private":true}\n')
        run("npm", "install", "--no-audit", "--no-fund", "--silent", *NPM_PACKAGES, cwd=npm_dir)
    return bin_dir


def up() -> None:
    root = state_dir()
    if (root / "deployment.json").exists():
        sys.exit(f"a deployment already lives in {root}: ./down first (or set REFDEPLOY_STATE)")
    if os.geteuid() != 0:
        sys.exit("run ./up as root: it installs Debian packages and talks to the system libvirtd")
    say(f"vpsshop reference deployment in {root}")
    apt_started = install_system_packages()
    for sub in (
        "logs",
        "supervisor/conf.d",
        "etc",
        "lib",
        "nginx/tmp",
        "prometheus/data",
        "chain/litecoin",
        "chain/monero",
        "chain/wallets-sender",
        "chain/wallets-shop",
        "tls",
        "run",
    ):
        (root / sub).mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    venv = make_venv(root)
    bin_dir = npm_bin(root)
    tag = env("NAME", "ref-" + secrets.token_hex(3))
    ports = {name: int(env(f"PORT_{name.upper()}", "0")) or free_port() for name in PORT_NAMES}
    state: dict[str, Any] = {
        "root": str(root),
        "name": tag,
        "venv": str(venv),
        "npm_bin": str(bin_dir),
        "ports": ports,
        "listen": env("LISTEN", "127.0.0.1"),
        "apt_started": apt_started,
        "pg_admin_url": env("PG_ADMIN_URL", ""),
        "pg_cluster": env("PG_CLUSTER", ""),
        "real_guest": env("REAL_GUEST", "") == "1",
        "db_name": env("DB_NAME", "vpsshop_" + tag.replace("-", "_")),
        "ltc_password": secrets.token_hex(16),
        "supervisord_conf": str(root / "supervisor" / "supervisord.conf"),
        "pool": f"vpsshop-{tag}",
        "pool_dir": f"{env('IMAGES', '/var/lib/libvirt/images')}/vpsshop-{tag}",
        "libvirt_uri": env("LIBVIRT_URI", "qemu:///system"),
        "console_allow": env("CONSOLE_ALLOW", "127.0.0.1"),
    }
    save_state(state)
    python = str(venv / "bin" / "python")
    os.execv(python, [python, __file__, "_up"])


# ---- up, continued under the virtualenv ------------------------------------------------------------


def render_units(text: str, state: dict[str, Any]) -> str:
    """``supervisor/vpsshop.conf`` as this deployment installs it: each path and port a reseller
    would use replaced by this deployment's (in one pass, so nothing replaced is replaced again)."""
    subs = unit_substitutions(state)
    pattern = re.compile(
        "|".join(
            rf"(?<!\d){key}(?!\d)" if key.isdigit() else rf"(?<![\w/.-]){re.escape(key)}(?![\w.-])" for key in subs
        )
    )
    return pattern.sub(lambda match: subs[match.group(0)], text)


def unit_substitutions(state: dict[str, Any]) -> dict[str, str]:
    """The paths and ports of ``supervisor/vpsshop.conf`` and what this deployment puts in their place."""
    root, p = state["root"], state["ports"]
    return {
        "/opt/vpsshop/venv": state["venv"],
        "/etc/vpsshop": f"{root}/etc",
        "/var/lib/vpsshop": f"{root}/lib",
        "/var/log/vpsshop": f"{root}/logs",
        "8001": str(p["api1"]),
        "8002": str(p["api2"]),
        "8003": str(p["console_api"]),
        "8081": str(p["console"]),
    }


def supervisord_conf(state: dict[str, Any], own_libvirtd: bool) -> str:
    """supervisord's own configuration: the peers' programs, and vpsshop's programs included from
    ``supervisor/conf.d/vpsshop.conf`` (the shipped file, installed by :func:`install_units`)."""
    root, p, b = state["root"], state["ports"], state["npm_bin"]
    chain = f"{root}/chain"

    def program(name: str, command: str, **extra: str) -> str:
        lines = [
            f"[program:{name}]",
            f"command={command}",
            "autostart=false",
            "autorestart=true",
            "startsecs=2",
            "stopasgroup=true",
            "killasgroup=true",
            "stopwaitsecs=30",
            f"stdout_logfile={root}/logs/{name}.log",
            "redirect_stderr=true",
            "stdout_logfile_maxbytes=10MB",
        ]
        lines += [f"{k}={v}" for k, v in extra.items()]
        return "\n".join(lines) + "\n"

    parts = [
        f"""[unix_http_server]
file={root}/run/supervisor.sock
chmod=0700

[supervisord]
logfile={root}/logs/supervisord.log
pidfile={root}/run/supervisord.pid
childlogdir={root}/logs
identifier=vpsshop-{state["name"]}

[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface

[supervisorctl]
serverurl=unix://{root}/run/supervisor.sock

[include]
files = {root}/supervisor/conf.d/*.conf
"""
    ]
    parts.append(
        program(
            "anvil",
            f"{b}/anvil --host 127.0.0.1 --port {p['anvil']} --chain-id {CHAIN_ID} "
            f"--block-time 1 --state {chain}/anvil-state.json --silent",
        )
    )
    parts.append(
        program(
            "litecoind",
            f"/usr/bin/litecoind -regtest -datadir={chain}/litecoin -rpcport={p['ltc_rpc']} "
            f"-port={p['ltc_p2p']} -rpcbind=127.0.0.1 -rpcallowip=127.0.0.1 -rpcuser=vpsshop "
            f"-rpcpassword={state['ltc_password']} -listen=0 -server -fallbackfee=0.0002 "
            "-printtoconsole=1",
        )
    )
    parts.append(
        program(
            "monerod",
            f"/usr/bin/monerod --regtest --offline --fixed-difficulty 1 --non-interactive "
            f"--no-igd --data-dir {chain}/monero --p2p-bind-ip 127.0.0.1 "
            f"--p2p-bind-port {p['xmr_p2p']} --rpc-bind-ip 127.0.0.1 "
            f"--rpc-bind-port {p['xmr_rpc']} "
            f"--zmq-rpc-bind-port {p['xmr_zmq']} --log-level 0",
        )
    )
    for wallet in ("sender", "shop"):
        parts.append(
            program(
                f"monero-wallet-{wallet}",
                f"/usr/bin/monero-wallet-rpc --daemon-address 127.0.0.1:{p['xmr_rpc']} --trusted-daemon "
                f"--disable-rpc-login --wallet-dir {chain}/wallets-{wallet} --rpc-bind-ip 127.0.0.1 "
                f"--rpc-bind-port {p[f'xmr_{wallet}']} --non-interactive --log-level 0",
            )
        )
    if own_libvirtd:
        parts.append(program("virtlogd", "/usr/sbin/virtlogd", priority="10"))
        parts.append(program("libvirtd", "/usr/sbin/libvirtd", priority="20"))
    if state["libvirt_uri"] == "qemu:///system":
        # started only when user vpsshop may not use libvirtd's own socket (no polkit answers):
        # a socket of its own, relayed to libvirtd's (see libvirt_for_service_user)
        parts.append(
            program(
                "libvirt-relay",
                f"/usr/bin/socat UNIX-LISTEN:{root}/run/libvirt-sock,fork,unlink-early,user={SERVICE_USER},"
                f"group={SERVICE_USER},mode=600 UNIX-CONNECT:{LIBVIRT_SOCKET}",
            )
        )
    parts.append(program("nginx", f"/usr/sbin/nginx -c {root}/nginx/nginx.conf -p {root}/nginx -g 'daemon off;'"))
    parts.append(
        program(
            "prometheus",
            f"/usr/bin/prometheus --config.file={root}/prometheus/prometheus.yml "
            f"--storage.tsdb.path={root}/prometheus/data "
            f"--web.listen-address=127.0.0.1:{p['prometheus']}",
        )
    )
    return "\n".join(parts)


def nginx_conf(state: dict[str, Any]) -> str:
    root, p = state["root"], state["ports"]
    return f"""# vpsshop reference deployment: TLS in front of two `vpsshop serve` processes, and in front of
# the operators' console on a port of its own (docs/operations.md, "The web console")
worker_processes 1;
pid {root}/run/nginx.pid;
error_log {root}/logs/nginx-error.log;
events {{ worker_connections 512; }}
http {{
    access_log {root}/logs/nginx-access.log;
    client_body_temp_path {root}/nginx/tmp/body;
    proxy_temp_path {root}/nginx/tmp/proxy;
    fastcgi_temp_path {root}/nginx/tmp/fastcgi;
    uwsgi_temp_path {root}/nginx/tmp/uwsgi;
    scgi_temp_path {root}/nginx/tmp/scgi;
    upstream vpsshop_api {{
        server 127.0.0.1:{p["api1"]} max_fails=0;
        server 127.0.0.1:{p["api2"]} max_fails=0;
        keepalive 16;
    }}
    server {{
        listen {state["listen"]}:{p["https"]} ssl;
        ssl_certificate {root}/tls/cert.pem;
        ssl_certificate_key {root}/tls/key.pem;
        client_max_body_size 128k;
        # x402's 402 carries the payment requirements in a PAYMENT-REQUIRED header: more than nginx's
        # default 4-8 KiB header buffer, which would answer 502 "upstream sent too big header"
        proxy_buffer_size 64k;
        proxy_buffers 8 64k;
        proxy_busy_buffers_size 128k;
        location /metrics {{ return 404; }}
        location / {{
            proxy_pass http://vpsshop_api;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto https;
            proxy_next_upstream error timeout;
        }}
    }}
    server {{
        listen {state["listen"]}:{p["console_https"]} ssl;
        ssl_certificate {root}/tls/cert.pem;
        ssl_certificate_key {root}/tls/key.pem;
        client_max_body_size 128k;
        allow {state["console_allow"]};
        deny all;
        location / {{
            proxy_pass http://127.0.0.1:{p["console"]};
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_set_header X-Forwarded-Proto https;
        }}
    }}
}}
"""


def prometheus_conf(state: dict[str, Any]) -> str:
    return f"""# vpsshop reference deployment: one API process of the host is scraped on its loopback port.
# Every API process of a host shows the figures of all of them (docs/operations.md, Metrics): a
# second target would count every figure twice in each sum.
global:
  scrape_interval: 2s
scrape_configs:
  - job_name: vpsshop
    metrics_path: /metrics
    static_configs:
      - targets: ['127.0.0.1:{state["ports"]["api1"]}']
"""


def shop_toml(state: dict[str, Any]) -> str:
    p = state["ports"]
    return f"""# vpsshop reference deployment (production mode on local regtest peers); written by ./up
database_url = "{state["database_url"]}"
secret_key = "{state["secret_key"]}"
encryption_key = "{state["encryption_key"]}"
public_url = "https://127.0.0.1:{p["https"]}/v1"

[server]
forwarded_allow_ips = ["127.0.0.1"]

[metrics]
multiprocess_dir = "{state["root"]}/lib/metrics"
{guest_catalog(state)}
[topups]
watch_interval_seconds = 2
poll_min_seconds = 1

[rates]
source = "fixed"

[rates.fixed]
prices = {{ LTC = "{LTC_USD}", XMR = "{XMR_USD}", USDCBASE = "1" }}

[coins.LTC]
xpub = "{state["ltc_xpub"]}"
network = "regtest"
rpc_url = "http://127.0.0.1:{p["ltc_rpc"]}/"
rpc_user = "vpsshop"
rpc_password = "{state["ltc_password"]}"
confirmations = 2

[coins.XMR]
address = "{state["xmr_address"]}"
view_key = "{state["xmr_view_key"]}"
network = "regtest"
wallet_rpc_url = "http://127.0.0.1:{p["xmr_shop"]}/json_rpc"
confirmations = 2

[coins.USDCBASE]
mode = "direct"
network = "base"
pay_to = "{state["pay_to"]}"
asset = "{state["usdc"]}"
rpc_url = "http://127.0.0.1:{p["anvil"]}"
relayer_key_env = "VPSSHOP_X402_RELAYER_KEY"
max_timeout_seconds = 120

[hypervisor]
backend = "libvirt"

[hypervisor.libvirt]
domain_type = "qemu"
shutdown_grace_seconds = 2
guest_reports = {"true" if state["real_guest"] else "false"}   # a blank disk boots no guest that could report
{guest_kernel_boot(state)}
[hypervisor.libvirt.locations."*"]   # one host serves every catalog location (production refuses unserved ones)
hosts = [{{ uri = "{state["shop_libvirt_uri"]}", name = "local", max_memory_mib = 8192 }}]
pool = "{state["pool"]}"
{guest_network(state)}"""


def guest_catalog(state: dict[str, Any]) -> str:
    """With REFDEPLOY_REAL_GUEST: the catalog's debian-12 is the Debian guest image (a catalog file
    of this deployment, the shipped one with the image file name changed)."""
    if not state["real_guest"]:
        return ""
    return f'\n[catalog.file]\npath = "{state["root"]}/etc/catalog.toml"\n'


def guest_kernel_boot(state: dict[str, Any]) -> str:
    """With REFDEPLOY_REAL_GUEST: the guest boots its own kernel (docs/servers.md, direct kernel boot)."""
    if not state["real_guest"]:
        return ""
    d = state["pool_dir"]
    return f"""
[hypervisor.libvirt.kernel_boot."{GUEST_IMAGE}"]
kernel = "{d}/vmlinuz"
initrd = "{d}/initrd.img"
cmdline = "{state["guest_cmdline"]}"
format = "raw"
"""


def guest_network(state: dict[str, Any]) -> str:
    """Blank disks: QEMU's user networking (nothing to reach). A real guest: a libvirt network of
    this deployment whose bridge holds the gateway address, so this host reaches the guest."""
    if not state["real_guest"]:
        return (
            'network = "user"\naddresses = "198.51.100.10-198.51.100.200"\ngateway = "198.51.100.1"\n'
            'ipv6 = "2001:db8:214::/64"\nipv6_gateway = "2001:db8:214::1"\n'
        )
    prefix = state["guest_prefix"]
    v6 = guest_ipv6_prefix(prefix)
    return (
        f'network = "network:{state["guest_network"]}"\naddresses = "{prefix}.10-{prefix}.60"\n'
        f'gateway = "{prefix}.1"\nnameservers = ["{prefix}.1"]\n'
        f'ipv6 = "{v6}/64"\nipv6_gateway = "{v6}1"\n'
    )


def guest_ipv6_prefix(prefix: str) -> str:
    """The IPv6 /64 of the guest network whose IPv4 /24 is ``prefix`` (without its length): a ULA,
    "10.214.7" -> "fd42:214:7::"; the bridge holds ``::1``."""
    second, third = prefix.split(".")[1:3]
    return f"fd42:{second}:{third}::"


def random_tpub() -> str:
    """A watch-only account key (BIP-32 tpub, depth 3) for LTC regtest deposits."""
    from coincurve import PrivateKey

    from vpsshop.hdkeys import b58check_encode

    raw = (
        bytes.fromhex("043587cf")
        + bytes([3])
        + b"\0" * 4
        + (0x80000000).to_bytes(4, "big")
        + secrets.token_bytes(32)
        + PrivateKey().public_key.format(compressed=True)
    )
    return b58check_encode(raw)


def _pg(url: str):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(url, autocommit=True)


def local_cluster(state: dict[str, Any]) -> tuple[str, str, int, bool]:
    """The local Debian cluster (``REFDEPLOY_PG_CLUSTER``, else the newest version's ``main``) as
    ``pg_lsclusters`` lists it: (version, name, port, online)."""
    listed = run("pg_lsclusters", "--no-header", quiet=True, check=False).stdout.split("\n")
    rows = [line.split() for line in listed if line.strip()]
    if state["pg_cluster"]:
        version, _, name = state["pg_cluster"].partition("/")
        rows = [r for r in rows if r[0] == version and r[1] == name]
    else:
        rows = sorted((r for r in rows if r[1] == "main"), key=lambda r: float(r[0]))[-1:]
    if not rows:
        sys.exit(f"no PostgreSQL cluster {state['pg_cluster'] or '*/main'} (apt-get install postgresql)")
    version, name, port, status = rows[-1][:4]
    return version, name, int(port), status == "online"


def local_psql(state: dict[str, Any], sql: str) -> None:
    """Run ``sql`` as the ``postgres`` superuser over the local cluster's socket (peer authentication)."""
    cluster = f"{state['pg_version']}/{state['pg_cluster_name']}"
    run(
        *("runuser", "-u", "postgres", "--", "psql", "--cluster", cluster, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql),
        quiet=True,
        cwd="/",
    )


def ensure_postgres(state: dict[str, Any]) -> None:
    """The deployment's database. With ``REFDEPLOY_PG_ADMIN_URL``: created there, used with the same
    credentials. Without: the local Debian cluster (started if it is not running, and then stopped
    by ``down``), a role of this deployment with a random password and a database it owns; vpsshop
    connects over TCP with it."""
    name = state["db_name"]
    if state["pg_admin_url"]:
        with _pg(state["pg_admin_url"]) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                sys.exit(f"database {name} exists already: choose another REFDEPLOY_DB_NAME")
            conn.execute(f'CREATE DATABASE "{name}"')
        base = state["pg_admin_url"].rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
        state["database_url"] = f"{base}/{name}"
        say(f"- PostgreSQL database {name} (at REFDEPLOY_PG_ADMIN_URL)")
        return
    version, cluster, port, online = local_cluster(state)
    state.update(pg_version=version, pg_cluster_name=cluster)
    if not online:
        say(f"- PostgreSQL: starting Debian's cluster {version}/{cluster} (./down stops it again)")
        run("pg_ctlcluster", version, cluster, "start")
        state["pg_started"] = True
        save_state(state)
    password = secrets.token_hex(16)
    local_psql(state, f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{password}'")
    state["pg_role"] = name
    local_psql(state, f'CREATE DATABASE "{name}" OWNER "{name}"')
    state["database_url"] = f"postgresql+psycopg://{name}:{password}@127.0.0.1:{port}/{name}"
    wait("PostgreSQL over TCP", lambda: _pg(state["database_url"].replace("+psycopg", "")).close() or True, 60)
    say(f"- PostgreSQL database {name} in cluster {version}/{cluster} (port {port}), owned by a role of its own")


def libvirt_answers(uri: str) -> bool:
    return subprocess.run(["virsh", "-c", uri, "version"], capture_output=True).returncode == 0


def kvm_for_group_kvm() -> None:
    """/dev/kvm for group kvm, mode 660, as Debian's udev rule makes it (docs/servers.md).

    In a container it is often root-only: libvirt then finds KVM unusable for QEMU's user and
    re-probes QEMU on every domain definition (half a minute each under load)."""
    kvm = Path("/dev/kvm")
    if kvm.exists() and (kvm.stat().st_mode & 0o777) == 0o600:
        run("chgrp", "kvm", str(kvm), quiet=True)
        kvm.chmod(0o660)
        say("- /dev/kvm given to group kvm (mode 660), as Debian's udev rule would")


def compile_and_deploy_usdc(state: dict[str, Any]) -> None:
    from eth_account import Account
    from web3 import Web3

    url = f"http://127.0.0.1:{state['ports']['anvil']}"
    out = Path(state["root"]) / "chain" / "solc"
    out.mkdir(exist_ok=True)
    run(
        f"{state['npm_bin']}/solcjs",
        "--bin",
        "--abi",
        "--optimize",
        "--base-path",
        str(ROOT),
        "-o",
        str(out),
        str(CONTRACT.relative_to(ROOT)),
        cwd=ROOT,
        quiet=True,
    )
    abi = json.loads(next(out.glob("*TestUSDC.abi")).read_text())
    bytecode = next(out.glob("*TestUSDC.bin")).read_text().strip()
    w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": 30}))
    deployer = w3.eth.accounts[0]
    tx = w3.eth.contract(abi=abi, bytecode=bytecode).constructor("USD Coin", "2").transact({"from": deployer})
    receipt = w3.eth.wait_for_transaction_receipt(tx, timeout=60, poll_latency=0.2)
    token = w3.eth.contract(address=receipt["contractAddress"], abi=abi)
    relayer = Account.create()
    shop = Account.create()
    customer = Account.create()
    w3.provider.make_request("anvil_setBalance", [relayer.address, hex(10**19)])
    tx = token.functions.mint(customer.address, 1000 * 10**6).transact({"from": deployer})
    w3.eth.wait_for_transaction_receipt(tx, timeout=60, poll_latency=0.2)
    state.update(
        usdc=str(token.address),
        usdc_abi=str(out),
        relayer_key=bytes(relayer.key).hex(),
        pay_to=shop.address,
        customer_key=bytes(customer.key).hex(),
        customer_address=customer.address,
    )
    say(
        f"- Base (anvil, chain {CHAIN_ID}): test USDC at {token.address}; customer wallet {customer.address} "
        "holds 1000 USDC"
    )


def init_litecoin(state: dict[str, Any]) -> None:
    wait("litecoind", lambda: ltc_rpc(state, "getblockcount") is not None)
    ltc_rpc(state, "createwallet", "miner")
    state["ltc_mine_to"] = ltc_rpc(state, "getnewaddress", "", "bech32", wallet="miner")
    ltc_rpc(state, "generatetoaddress", 101, state["ltc_mine_to"], wallet="miner")
    state["ltc_xpub"] = random_tpub()
    say("- litecoind regtest: wallet 'miner' funded (101 blocks)")


def init_monero(state: dict[str, Any]) -> None:
    daemon, sender, shop = xmr_urls(state)
    wait("monerod", lambda: xmr_call(f"{daemon}/json_rpc", "get_info"))
    for url in (sender, shop):
        wait("monero-wallet-rpc", lambda url=url: xmr_call(url, "get_version"))
    xmr_call(sender, "create_wallet", filename="sender", language="English")
    state["xmr_sender_address"] = xmr_call(sender, "get_address", account_index=0)["address"]
    xmr_call(shop, "create_wallet", filename="receiver", language="English")
    address = xmr_call(shop, "get_address", account_index=0)["address"]
    view_key = xmr_call(shop, "query_key", key_type="view_key")["key"]
    xmr_call(shop, "close_wallet")
    xmr_call(
        shop,
        "generate_from_keys",
        filename="shop-view-only",
        address=address,
        viewkey=view_key,
        password="",
        restore_height=0,
    )
    xmr_call(f"{daemon}/json_rpc", "generateblocks", amount_of_blocks=80, wallet_address=state["xmr_sender_address"])
    state.update(xmr_address=address, xmr_view_key=view_key)
    say("- monerod regtest: sender wallet funded (80 blocks); the shop holds a view-only wallet")


def ensure_service_user(state: dict[str, Any]) -> None:
    """The user the programs of supervisor/vpsshop.conf run as, made as docs/operations.md says
    when it does not exist (then ``down`` removes it again), and in group libvirt."""
    import grp
    import pwd

    try:
        pwd.getpwnam(SERVICE_USER)
    except KeyError:
        run(
            *("useradd", "--system", "--user-group", "--home-dir", "/var/lib/vpsshop", "--no-create-home"),
            *("--shell", "/usr/sbin/nologin", SERVICE_USER),
            quiet=True,
        )
        state["made_user"] = True
        save_state(state)
        try:
            grp.getgrnam("libvirt")
            run("usermod", "--append", "--groups", "libvirt", SERVICE_USER, quiet=True)
        except KeyError:
            pass
        say(f"- system user {SERVICE_USER}, in group libvirt (./down removes it again)")
    user = pwd.getpwnam(SERVICE_USER)
    venv_python = f"{state['venv']}/bin/python"
    if run(
        "runuser", "-u", SERVICE_USER, "--", venv_python, "-c", "import vpsshop", quiet=True, check=False
    ).returncode:
        sys.exit(f"user {SERVICE_USER} cannot run vpsshop from the virtualenv {state['venv']}: make it readable")
    root = Path(state["root"])
    for path, mode in ((root / "lib", 0o750), (root / "lib" / "metrics", 0o750), (root / "etc", 0o750)):
        path.mkdir(exist_ok=True)
        os.chown(path, 0 if path.name == "etc" else user.pw_uid, user.pw_gid)
        path.chmod(mode)


def libvirt_for_service_user(state: dict[str, Any]) -> None:
    """How user vpsshop reaches libvirtd. On Debian it may use ``qemu:///system`` when it is in group
    libvirt, which polkit checks; where no polkit answers (a container without a system bus) only
    root may, and the deployment gives vpsshop a socket of its own (mode 600) relayed by socat to
    libvirtd's: the same power group libvirt gives, nothing more."""
    uri = state["libvirt_uri"]
    state["shop_libvirt_uri"] = uri
    if uri != "qemu:///system":
        return
    probe = run("runuser", "-u", SERVICE_USER, "--", "virsh", "-c", uri, "version", quiet=True, check=False)
    if probe.returncode == 0:
        say(f"- libvirt: user {SERVICE_USER} uses {uri} (group libvirt)")
        return
    relay = f"{state['root']}/run/libvirt-sock"
    supervisorctl(state, "start", "libvirt-relay")
    wait("the libvirt relay", lambda: Path(relay).is_socket(), 30)
    state.update(libvirt_relay=relay, shop_libvirt_uri=f"qemu+unix:///system?socket={relay}")
    say(
        f"- libvirt: user {SERVICE_USER} may not use {uri} here (no polkit answers): it reaches libvirtd "
        f"through {relay} (socat, its own, mode 600)"
    )


def build_guest() -> Path:
    """scripts/build-test-guest.sh's Debian 12 guest (built once with debootstrap, then cached)."""
    say("- the Debian guest image (scripts/build-test-guest.sh: a few minutes the first time, then cached)")
    out = run(str(ROOT / "scripts" / "build-test-guest.sh"), quiet=True)
    return Path(out.stdout.strip().splitlines()[-1])


def make_guest_network(state: dict[str, Any]) -> None:
    """A libvirt network of this deployment for real guests: isolated (no DHCP, no DNS), its bridge
    holding the gateway address, so this host reaches each guest at its leased address."""
    import random

    uri = state["libvirt_uri"]
    Path("/var/lib/libvirt/dnsmasq").mkdir(parents=True, exist_ok=True)  # libvirt records MACs there
    used = {
        line.split()[3].rsplit(".", 1)[0]
        for line in run("ip", "-4", "-o", "addr", quiet=True).stdout.splitlines()
        if len(line.split()) > 3
    }
    prefix = next(p for p in (f"10.214.{random.randrange(1, 250)}" for _ in range(200)) if p not in used)
    name = f"vpsshop-{state['name']}"
    xml = Path(state["root"]) / "network.xml"
    xml.write_text(
        f"<network><name>{name}</name><bridge name='vps{secrets.token_hex(4)}' stp='off'/><dns enable='no'/>"
        f"<ip address='{prefix}.1' netmask='255.255.255.0'/>"
        f"<ip family='ipv6' address='{guest_ipv6_prefix(prefix)}1' prefix='64'/></network>"
    )
    run("virsh", "-c", uri, "net-define", str(xml), quiet=True)
    state.update(guest_network=name, guest_prefix=prefix)
    save_state(state)
    run("virsh", "-c", uri, "net-start", name, quiet=True)
    v6 = guest_ipv6_prefix(prefix)
    say(f"- libvirt network {name}: {prefix}.0/24 and {v6}/64, this host at {prefix}.1 and {v6}1")


def init_libvirt(state: dict[str, Any]) -> None:
    uri = state["libvirt_uri"]
    pool_dir = Path(state["pool_dir"])
    pool_dir.mkdir(parents=True)
    pool_dir.chmod(0o755)
    if state["real_guest"]:
        guest = build_guest()
        run("cp", "--sparse=always", str(guest / "rootfs.raw"), str(pool_dir / GUEST_IMAGE), quiet=True)
        for name in ("vmlinuz", "initrd.img"):
            shutil.copy(guest / name, pool_dir / name)
        state["guest_cmdline"] = (guest / "cmdline").read_text().strip()
        catalog = (ROOT / "plugins" / "vpsshop_catalog" / "catalog.toml").read_text()
        (Path(state["root"]) / "etc" / "catalog.toml").write_text(
            catalog.replace("debian-12-genericcloud-amd64.qcow2", GUEST_IMAGE)
        )
        what = f"the Debian 12 guest ({GUEST_IMAGE}, direct kernel boot)"
        make_guest_network(state)
    else:
        # A tiny base image made here (no download exists): a blank qcow2 under the catalog's image name.
        run("qemu-img", "create", "-q", "-f", "qcow2", str(pool_dir / "debian-12-genericcloud-amd64.qcow2"), "1G")
        what = "a blank debian-12 base image (REFDEPLOY_REAL_GUEST=1 for a bootable one)"
    xml = Path(state["root"]) / "pool.xml"
    xml.write_text(f"<pool type='dir'><name>{state['pool']}</name><target><path>{pool_dir}</path></target></pool>")
    run("virsh", "-c", uri, "pool-define", str(xml), quiet=True)
    run("virsh", "-c", uri, "pool-start", state["pool"], quiet=True)
    say(f"- libvirt ({uri}): storage pool {state['pool']} at {pool_dir} with {what}")


def install_files(state: dict[str, Any]) -> None:
    """vpsshop's configuration where supervisor/vpsshop.conf looks for it (its /etc/vpsshop), owned by
    vpsshop, mode 0600: vpsshop.toml, and ``environment`` with the secret kept out of the TOML file."""
    import pwd

    user = pwd.getpwnam(SERVICE_USER)
    etc = Path(state["root"]) / "etc"
    files = {
        etc / "vpsshop.toml": shop_toml(state),
        etc / "environment": f"VPSSHOP_X402_RELAYER_KEY={state['relayer_key']}\n",
    }
    if state["real_guest"]:
        files[etc / "catalog.toml"] = (etc / "catalog.toml").read_text()
    for path, text in files.items():
        path.write_text(text)
        os.chown(path, user.pw_uid, user.pw_gid)
        path.chmod(0o600)


def install_units(state: dict[str, Any]) -> None:
    """supervisor/vpsshop.conf, installed as docs/operations.md says (conf.d, then reread and
    update), with this deployment's paths and ports (:func:`render_units`): supervisord starts its
    programs."""
    installed = Path(state["root"]) / "supervisor" / "conf.d" / "vpsshop.conf"
    installed.write_text(render_units(UNITS.read_text(), state))
    say(f"- {UNITS.relative_to(ROOT)} installed as {installed} (its paths and ports replaced)")
    supervisorctl(state, "reread")
    supervisorctl(state, "update")


def make_cert(root: Path) -> None:
    run(
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "30",
        "-subj",
        "/CN=127.0.0.1",
        "-addext",
        "subjectAltName=IP:127.0.0.1,DNS:localhost",
        "-keyout",
        str(root / "tls" / "key.pem"),
        "-out",
        str(root / "tls" / "cert.pem"),
        quiet=True,
    )
    (root / "tls" / "key.pem").chmod(0o600)


def add_operator(state: dict[str, Any]) -> None:
    """An operator of the web console, added as docs/operations.md says (``vpsshop admin operator add``,
    the password on standard input): role support. Its password and TOTP secret stay in the state
    file (mode 0600) for the walk, which signs in with a code computed from the secret."""
    root = Path(state["root"])
    name, password = "walk-operator", secrets.token_urlsafe(18)
    added = run(
        *("runuser", "-u", SERVICE_USER, "--", f"{state['venv']}/bin/vpsshop", "admin", "operator", "add", name),
        *("--role", "support", "--password-stdin", "--config", str(root / "etc" / "vpsshop.toml")),
        input=password + "\n",
        cwd=root / "lib",
        quiet=True,
    )
    found = re.search(r"^TOTP secret: (\S+)$", added.stdout, re.M)
    if found is None:
        sys.exit(f"vpsshop admin operator add printed no TOTP secret: {added.stdout} {added.stderr}")
    state["operator"] = {"name": name, "password": password, "totp_secret": found[1]}
    save_state(state)
    say(f"- console operator {name} (role support); its password and TOTP secret are in deployment.json")


def api_get(state: dict[str, Any], path: str, **kw: Any) -> Any:
    import httpx

    base = f"https://127.0.0.1:{state['ports']['https']}/v1"
    return httpx.get(base + path, verify=str(Path(state["root"]) / "tls" / "cert.pem"), timeout=30, **kw)


def console_client(state: dict[str, Any]) -> Any:
    """An HTTP client of the console's own TLS port (cookies kept, redirects not followed)."""
    import httpx

    base = f"https://127.0.0.1:{state['ports']['console_https']}"
    return httpx.Client(base_url=base, verify=str(Path(state["root"]) / "tls" / "cert.pem"), timeout=60)


def console_answers(state: dict[str, Any]) -> bool:
    with console_client(state) as client:
        return bool(client.get("/signin").status_code == 200)


def up_in_venv() -> None:
    from cryptography.fernet import Fernet

    state = load_state()
    root = Path(state["root"])
    ensure_postgres(state)
    ensure_service_user(state)
    state.update(secret_key=secrets.token_urlsafe(32), encryption_key=Fernet.generate_key().decode())
    own_libvirtd = not libvirt_answers(state["libvirt_uri"])
    if own_libvirtd and state["libvirt_uri"] != "qemu:///system":
        sys.exit(f"libvirtd does not answer on {state['libvirt_uri']}")
    state["own_libvirtd"] = own_libvirtd
    save_state(state)
    conf = Path(state["supervisord_conf"])
    conf.write_text(supervisord_conf(state, own_libvirtd))
    conf.chmod(0o600)
    say("- supervisord")
    run("supervisord", "-c", str(conf))
    wait("supervisord", lambda: supervisorctl(state, "pid", check=False).returncode == 0, 30)
    peers = ["anvil", "litecoind", "monerod", "monero-wallet-sender", "monero-wallet-shop"]
    if own_libvirtd:
        peers = ["virtlogd", "libvirtd", *peers]
    if own_libvirtd:
        kvm_for_group_kvm()
    supervisorctl(state, "start", *peers)
    if own_libvirtd:
        # libvirtd answers once its QEMU driver has probed the emulator: tens of seconds on a busy host.
        wait("libvirtd", lambda: libvirt_answers(state["libvirt_uri"]), 180)
    from web3 import Web3

    anvil = Web3(Web3.HTTPProvider(f"http://127.0.0.1:{state['ports']['anvil']}"))
    wait("anvil", lambda: anvil.eth.chain_id == CHAIN_ID)
    compile_and_deploy_usdc(state)
    init_litecoin(state)
    init_monero(state)
    init_libvirt(state)
    libvirt_for_service_user(state)
    make_cert(root)
    save_state(state)
    install_files(state)
    (root / "nginx" / "nginx.conf").write_text(nginx_conf(state))
    (root / "prometheus" / "prometheus.yml").write_text(prometheus_conf(state))
    venv_bin = Path(state["venv"]) / "bin"
    run(
        *("runuser", "-u", SERVICE_USER, "--", str(venv_bin / "vpsshop"), "migrate"),
        *("--config", str(root / "etc" / "vpsshop.toml")),
        cwd=root / "lib",
    )
    add_operator(state)
    install_units(state)
    supervisorctl(state, "start", "nginx", "prometheus")
    wait("vpsshop behind nginx", lambda: api_get(state, "/health").status_code in (200, 503), 180)
    wait("the console behind nginx", lambda: console_answers(state), 180)
    health = api_get(state, "/health").json()
    save_state(state)
    say(f"- /v1/health: {health.get('status')}")
    for component in health.get("components") or []:
        detail = f", {component['detail']}" if component.get("detail") else ""  # production hides details
        say(f"    {component['kind']} {component['id']}: {'ready' if component['ready'] else 'NOT READY'}{detail}")
    say(f"""
The shop is up:
  API          https://127.0.0.1:{state["ports"]["https"]}/v1  (self-signed: {root}/tls/cert.pem)
  dashboard    https://127.0.0.1:{state["ports"]["https"]}/dashboard/
  console      https://127.0.0.1:{state["ports"]["console_https"]}/  (operator {state["operator"]["name"]})
  Prometheus   http://127.0.0.1:{state["ports"]["prometheus"]}/
  processes    supervisorctl -c {state["supervisord_conf"]} status
Next: ./walk, then ./down""")


# ---- walk -------------------------------------------------------------------------------------------


class Walk:
    def __init__(self, state: dict[str, Any]) -> None:
        import httpx

        self.state = state
        self.base = f"https://127.0.0.1:{state['ports']['https']}/v1"
        self.http = httpx.Client(base_url=self.base, verify=str(Path(state["root"]) / "tls" / "cert.pem"), timeout=60)
        self.results: dict[str, Any] = {}
        self.step_no = 0

    def step(self, title: str) -> None:
        self.step_no += 1
        say(f"\n== {self.step_no}. {title}")

    def ok(self, key: str, value: Any, line: str) -> None:
        self.results[key] = value
        say(f"   {line}")

    def balance(self) -> str:
        """The balance once two reads in a row agree. nginx alternates between the API processes, and
        a process learns of another's write by PostgreSQL's NOTIFY a moment after the commit (its
        authentication cache, vpsshop/authcache.py), so right after a write one read may be older."""
        last = None
        deadline = time.monotonic() + 10
        while True:
            now = str(self.http.get("/account", headers=self.auth).json()["balance_usd"])
            if now == last or time.monotonic() > deadline:
                return now
            last = now
            time.sleep(0.1)

    def metrics(self) -> dict[str, float]:
        """The ``vpsshop_`` samples of one API process's /metrics (each port shows the whole host)."""
        import httpx

        response = httpx.get(f"http://127.0.0.1:{self.state['ports']['api1']}/metrics", timeout=10)
        if response.status_code != 200:
            raise SystemExit(f"/metrics answered {response.status_code}: {response.text[:200]}")
        samples: dict[str, float] = {}
        for line in response.text.splitlines():
            if line.startswith("vpsshop_") and "_bucket{" not in line:
                series, _, value = line.rpartition(" ")
                try:
                    samples[series] = float(value)
                except ValueError:
                    pass
        return samples

    def wait_topup(self, ref: str, mine: Any, seconds: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while True:
            body = self.http.get(f"/topups/{ref}", headers=self.auth).json()
            if body.get("status") == "completed":
                return body
            if time.monotonic() > deadline:
                raise SystemExit(f"top-up {ref} was not credited within {seconds:.0f} s: {body}")
            mine()
            time.sleep(1)

    def run(self) -> dict[str, Any]:
        s = self.state
        before = self.metrics()

        self.step("Create an account: POST /v1/account")
        created = self.http.post("/account")
        assert created.status_code == 201, created.text
        self.auth = {"Authorization": f"Bearer {created.json()['api_key']}"}
        self.ok(
            "account",
            created.json()["user_id"],
            f"201, user {created.json()['user_id']}, balance "
            f"{self.balance()} USD; the api_key and login_token are shown once",
        )

        self.step("Top up 25 USD in USDC on Base with the official x402 client (PyPI x402)")
        body = {"amount": 25, "coin": "USDCBASE"}
        first = self.http.post("/topups", json=body, headers=self.auth)
        self.ok(
            "x402_required", first.status_code, f"POST /v1/topups: {first.status_code} with the payment requirements"
        )
        header = sign_x402(s, first.json()["accepts"][0])
        paid = self.http.post("/topups", json=body, headers={**self.auth, "X-PAYMENT": header})
        settled = json.loads(base64.b64decode(paid.headers.get("X-PAYMENT-RESPONSE", "e30=")))
        self.ok(
            "x402",
            paid.json().get("status"),
            f"re-sent with X-PAYMENT: {paid.status_code}, status "
            f"{paid.json().get('status')}, settled in {settled.get('transaction')}; balance {self.balance()} USD",
        )

        self.step("Pay 25 USD in LTC from the regtest wallet and mine until credited")
        topup = self.http.post("/topups", json={"amount": 25, "coin": "LTC"}, headers=self.auth).json()
        txid = ltc_rpc(s, "sendtoaddress", topup["deposit_address"], topup["deposit_amount"], wallet="miner")
        say(f"   sent {topup['deposit_amount']} LTC to {topup['deposit_address']} (tx {txid[:16]}...)")
        self.ltc_txid = txid
        done = self.wait_topup(
            topup["ref"], lambda: ltc_rpc(s, "generatetoaddress", 1, s["ltc_mine_to"], wallet="miner")
        )
        self.ok(
            "ltc",
            done["status"],
            f"top-up {done['status']}, credited {done.get('credited_usd')} USD; balance {self.balance()} USD",
        )

        self.step("Pay 25 USD in XMR from the regtest wallet and mine until credited")
        daemon, sender, _shop = xmr_urls(s)
        topup = self.http.post("/topups", json={"amount": 25, "coin": "XMR"}, headers=self.auth).json()
        atomic = int(Decimal(topup["deposit_amount"]) * 10**12)
        xmr_call(sender, "refresh")
        sent = xmr_call(
            sender,
            "transfer",
            destinations=[{"address": topup["deposit_address"], "amount": atomic}],
            account_index=0,
            priority=0,
        )
        say(f"   sent {topup['deposit_amount']} XMR (tx {sent['tx_hash'][:16]}...)")
        done = self.wait_topup(
            topup["ref"],
            lambda: xmr_call(
                f"{daemon}/json_rpc", "generateblocks", amount_of_blocks=1, wallet_address=s["xmr_sender_address"]
            ),
        )
        self.ok(
            "xmr",
            done["status"],
            f"top-up {done['status']}, credited {done.get('credited_usd')} USD; balance {self.balance()} USD",
        )

        order_body: dict[str, Any] = {"plan": "pup", "location": "nl", "os": "debian-12"}
        if s["real_guest"]:
            self.step("Store an SSH key: POST /v1/ssh-keys")
            key = guest_key(s)
            stored = self.http.post(
                "/ssh-keys", json={"name": "walk", "public_key": key.with_suffix(".pub").read_text()}, headers=self.auth
            )
            assert stored.status_code == 201, stored.text
            order_body.update(hostname="walk-guest", ssh_keys=[stored.json()["id"]])
            self.ok("ssh_key", stored.status_code, f"201, key {stored.json()['fingerprint']}")

        self.step("Order a server: POST /v1/servers (plan pup, location nl, debian-12)")
        order = self.http.post("/servers", json=order_body, headers=self.auth)
        assert order.status_code == 201, order.text
        server_id = order.json()["server"]["id"]
        self.ok(
            "order",
            order.status_code,
            f"201, server {server_id} {order.json()['server']['status']}; balance {self.balance()} USD",
        )

        self.step("Watch it become active: once the guest reports its first boot done and SSH answering")
        deadline = time.monotonic() + 600
        waiting: set[str] = set()
        while True:
            server = self.http.get(f"/servers/{server_id}", headers=self.auth).json()
            if server["status"] != "provisioning" or time.monotonic() > deadline:
                break
            if server.get("status_reason"):
                waiting.add(server["status_reason"])
            time.sleep(0.5)
        for reason in sorted(waiting):
            say(f"   while provisioning: {reason}")
        self.ok(
            "active",
            server["status"],
            f"status {server['status']}, ip {server.get('ip')}, ipv6 {server.get('ipv6')}, "
            f"ready_at {server.get('ready_at')}, "
            f"expires {server.get('expires_at')}"
            + ("" if s["real_guest"] else " (a blank disk: guest_reports is off, so active when the domain runs)"),
        )
        if s["real_guest"]:
            self.step("Check its SSH host keys: the API's fingerprints against ssh-keyscan, then a strict login")
            assert server.get("ready_at") and not server.get("status_reason"), server
            shown = {k["fingerprint"] for k in server["host_keys"]}
            scanned = keyscan_fingerprints(server["ip"])
            for k in server["host_keys"]:
                say(f"   {k['type']} {k['fingerprint']}")
            self.ok(
                "host_keys_match", bool(shown) and shown == scanned, f"ssh-keyscan sees the same {len(scanned)} keys"
            )
            known_hosts = Path(s["root"]) / "walk" / "known_hosts"
            names = f"{server['ip']},{server['ipv6']}" if server.get("ipv6") else server["ip"]
            known_hosts.write_text("".join(f"{names} {k['type']} {k['key']}\n" for k in server["host_keys"]))
            self.step(
                f"Log in over SSH as root with the ordered key, StrictHostKeyChecking=yes (ssh root@{server['ip']})"
            )
            hostname = guest_login(server["ip"], key, known_hosts=known_hosts)
            self.ok(
                "ssh_key_login", hostname, f"logged in, the host key checked against the API's: hostname {hostname}"
            )
            if server.get("ipv6"):
                self.step(f"Log in over IPv6, on the address the API gives (ssh root@{server['ipv6']})")
                hostname6 = guest_login(server["ipv6"], key, seconds=60, known_hosts=known_hosts)
                self.ok("ssh_ipv6_login", hostname6, f"logged in over IPv6, the same host keys: hostname {hostname6}")

        self.step("Read its credentials: GET /v1/servers/{id}/credentials")
        creds = self.http.get(f"/servers/{server_id}/credentials", headers=self.auth)
        self.ok(
            "credentials",
            creds.status_code,
            f"{creds.status_code}, user {creds.json().get('username')}, a "
            f"password of {len(creds.json().get('password') or '')} characters "
            f"(Cache-Control: {creds.headers.get('cache-control')})",
        )
        if s["real_guest"]:
            self.step("Log in over SSH with that password")
            uid = guest_password_login(s, server["ip"], creds.json()["password"])
            self.ok("ssh_password_login", uid, f"logged in as uid {uid}")

        self.step("Renew it for one more cycle: POST /v1/servers/{id}/renew")
        renewed = self.http.post(f"/servers/{server_id}/renew", headers=self.auth)
        body = renewed.json()
        self.ok(
            "renew",
            renewed.status_code,
            f"{renewed.status_code}, charged {body.get('charged_usd')} USD, "
            f"now expires "
            f"{(body.get('server') or {}).get('expires_at')}; balance {self.balance()} USD",
        )

        self.step("Resize it to terrier (2 GiB, 40 GiB disk): POST /v1/servers/{id}/resize/quote, then /resize")
        wanted = {"plan": "terrier"}
        quote = self.http.post(f"/servers/{server_id}/resize/quote", headers=self.auth, json=wanted).json()
        say(
            f"   quote: {quote.get('price_usd')} USD for the {quote.get('seconds_left')} s left of the paid "
            f"period; renewals then {quote.get('period_price_usd')} USD"
        )
        resized = self.http.post(f"/servers/{server_id}/resize", headers=self.auth, json=wanted)
        charged = resized.json().get("charged_usd")
        deadline = time.monotonic() + 900
        while True:
            server = self.http.get(f"/servers/{server_id}", headers=self.auth).json()
            settled = (
                server["plan"] == "terrier" and not server.get("status_reason") and server.get("power") == "running"
            )
            if settled or time.monotonic() > deadline:
                break
            time.sleep(1)
        self.ok(
            "resize",
            server["plan"] if settled and _not_above(charged, quote.get("price_usd")) else None,
            f"{resized.status_code}, charged {charged} USD (the quote said {quote.get('price_usd')}: never "
            f"more), plan "
            f"{server['plan']}, power {server.get('power')}; balance {self.balance()} USD",
        )
        if s["real_guest"]:
            self.step("In the guest, once it is back up: the new plan's memory and disk (free -m, df)")
            sizes = guest_run(server["ip"], key, "free -m | awk '/^Mem:/{print $2}'; df -BG --output=size / | tail -1")
            memory, disk = sizes.split()
            self.ok("resize_guest", int(memory), f"{memory} MiB of memory, a {disk} root file system")

        self.step("See the figures move in /metrics (one API process shows the host), and in Prometheus")
        time.sleep(1)
        after = self.metrics()
        moved = {k: (before.get(k, 0.0), v) for k, v in after.items() if v != before.get(k, 0.0)}
        first = (
            "vpsshop_credited_usd_total",
            "vpsshop_orders_total",
            "vpsshop_renewals_total",
            "vpsshop_topups",
            "vpsshop_x402_settlements_total",
        )
        shown = sorted(moved.items(), key=lambda item: (not item[0].startswith(first), item[0]))[:16]
        for series, (old, new) in shown:
            say(f"   {series}: {old:g} -> {new:g}")
        for name in ("credited_usd_total", "orders_total", "renewals_total"):
            delta = sum(new - old for series, (old, new) in moved.items() if series.split("{")[0] == f"vpsshop_{name}")
            self.results[f"metrics_{name}"] = delta
        self.ok("metrics", len(moved), f"{len(moved)} series moved")
        up_series = prometheus_query(s, 'up{job="vpsshop"}', lambda values: values == ["1"])
        self.ok("prometheus_up", up_series, f'Prometheus: up{{job="vpsshop"}} = {up_series} (one target per host)')
        # Prometheus' sums over the job equal the host's figures: each counted once, not once per process
        sums, totals = {}, {}
        for name in ("credited_usd_total", "orders_total", "renewals_total"):
            direct = totals[name] = sum(v for k, v in after.items() if k.split("{")[0] == f"vpsshop_{name}")
            query = f'sum(vpsshop_{name}{{job="vpsshop"}})'
            found = prometheus_query(s, query, lambda values, direct=direct: values == [f"{direct:g}"])
            sums[name] = float(found[0]) if found else None
            say(f"   Prometheus: {query} = {found} (/metrics: {direct:g})")
        self.results.update(prometheus_sums=sums, metrics_totals=totals)
        self.operator_credit(self.results["account"], self.ltc_txid)
        say("\nThe walk is done.")
        return self.results

    def operator_credit(self, account_id: int, txid: str) -> None:
        """An operator's way through the console, on its own port: sign in with the password and a
        TOTP code, find the customer by the LTC top-up's transaction id, credit 1 USD with a reason
        (the form, then its confirmation), and see the balance, the ledger, the customer's event and
        the audit log show it. The public port knows no console page."""
        import pyotp

        s = self.state
        operator = s["operator"]
        self.step("An operator credits the customer 1 USD in the web console (its own port, password and TOTP)")
        public = [self.http.get(f"https://127.0.0.1:{s['ports']['https']}{path}").status_code for path in CONSOLE_PATHS]
        self.ok("console_on_api_port", public, f"the public port answers {public} for {', '.join(CONSOLE_PATHS)}")
        console = console_client(s)
        form = console.get("/signin")
        signed = console.post(
            "/signin",
            data={
                "csrf": csrf_of(form.text),
                "name": operator["name"],
                "password": operator["password"],
                "code": pyotp.TOTP(operator["totp_secret"]).now(),
            },
        )
        self.ok(
            "console_signin",
            signed.status_code,
            f"GET /signin {form.status_code}, POST /signin {signed.status_code} to {signed.headers.get('location')}",
        )
        found = console.get("/search", params={"q": txid})
        matched = re.search(r'Account <a href="/accounts/(\d+)">\d+</a> \(matched by ([^)]*)\)', found.text)
        self.ok(
            "console_search",
            int(matched[1]) if matched else None,
            f"search for {txid[:16]}...: " + (f"account {matched[1]}, matched by {matched[2]}" if matched else "none"),
        )
        before = Decimal(self.balance())
        reason = f"walk: goodwill credit {secrets.token_hex(3)}"
        page = console.get(f"/accounts/{account_id}")
        fields = {"amount": "1", "reason": reason}
        confirm = console.post(f"/accounts/{account_id}/credit", data={**fields, "csrf": csrf_of(page.text)})
        done = console.post(
            f"/accounts/{account_id}/credit", data={**fields, "confirm": "yes", "csrf": csrf_of(confirm.text)}
        )
        after = Decimal(self.balance())
        deadline = time.monotonic() + 10  # the API processes learn of the console's write a moment later
        while after == before and time.monotonic() < deadline:
            time.sleep(0.3)
            after = Decimal(self.balance())
        self.ok(
            "console_credit",
            str(after - before),
            f"credit form {confirm.status_code} (a confirmation page), confirmed {done.status_code} to "
            f"{done.headers.get('location')}; balance {before} -> {after} USD",
        )
        entry = self.ledger_credit(reason)
        self.ok(
            "console_ledger",
            [entry.get("reason"), entry.get("amount_usd")],
            f"the customer's ledger.credit event: {entry.get('reason')} {entry.get('amount_usd')} USD, memo {reason!r}",
        )
        audit = console.get("/audit")
        row = next((r for r in audit.text.split("<tr>") if reason in r), "")
        who = re.search(r"<td>(console:[^<]*)</td><td>([^<]*)</td>", row)
        self.ok(
            "console_audit",
            [who[1], who[2]] if who else None,
            f"the audit log: {who[1] + ' ' + who[2] if who else 'no row'} with the reason",
        )

    def ledger_credit(self, memo: str, seconds: float = 10) -> dict[str, Any]:
        """The data of the customer's ``ledger.credit`` event with this memo, read from GET /v1/events
        (page after page), or ``{}`` when none is listed within ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            params: dict[str, Any] = {"limit": 100}
            while True:
                page = self.http.get("/events", params=params, headers=self.auth).json()
                for event in page.get("events", []):
                    if event["type"] == "ledger.credit" and event["data"].get("memo") == memo:
                        return dict(event["data"])
                if not page.get("has_more"):
                    break
                params["after"] = page["cursor"]
            if time.monotonic() > deadline:
                return {}
            time.sleep(0.5)


CONSOLE_PATHS = ("/signin", "/audit")


def csrf_of(html: str) -> str:
    """The CSRF token of the first form of a console page."""
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    return found[1] if found else ""


def prometheus_query(state: dict[str, Any], query: str, done: Any) -> list[str]:
    """The values of an instant query, asked again (scrapes come every 2 s) until ``done(values)`` or 30 s."""
    import httpx

    deadline = time.monotonic() + 30
    while True:
        answer = httpx.get(
            f"http://127.0.0.1:{state['ports']['prometheus']}/api/v1/query", params={"query": query}, timeout=10
        ).json()
        values = sorted(r["value"][1] for r in answer["data"]["result"])
        if done(values) or time.monotonic() > deadline:
            return values
        time.sleep(1)


def guest_key(state: dict[str, Any]) -> Path:
    """The customer's SSH key for the walk (ed25519, made once per deployment)."""
    key = Path(state["root"]) / "walk" / "id_ed25519"
    if not key.exists():
        key.parent.mkdir(mode=0o700, exist_ok=True)
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "walk", "-f", str(key), quiet=True)
    return key


SSH_OPTIONS = (
    *("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5"),
    *("-o", "LogLevel=ERROR"),
)


def keyscan_fingerprints(ip: str) -> set[str]:
    """SHA256 fingerprints of the host keys ``ssh-keyscan`` sees from this host."""
    out = run("ssh-keyscan", "-T", "5", ip, check=False, quiet=True).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and not line.startswith("#"):
            digest = hashlib.sha256(base64.b64decode(parts[2])).digest()
            found.add("SHA256:" + base64.b64encode(digest).decode().rstrip("="))
    return found


def guest_login(ip: str, key: Path, seconds: float = 600, known_hosts: Path | None = None) -> str:
    """Log in as root with ``key`` once the guest has booted and cloud-init has finished: its hostname.
    With ``known_hosts``, the host key must be one of its lines (StrictHostKeyChecking=yes)."""
    deadline = time.monotonic() + seconds
    last = ""
    options: tuple[str, ...] = SSH_OPTIONS
    if known_hosts is not None:
        options = (
            *("-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}"),
            *("-o", "GlobalKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR"),
        )
    while time.monotonic() < deadline:
        try:
            done = subprocess.run(
                [
                    *("ssh", *options, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", str(key)),
                    *(f"root@{ip}", "cloud-init status --wait --long; hostname"),
                ],
                capture_output=True,
                text=True,
                timeout=max(10.0, deadline - time.monotonic()),
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            last = "no answer"
            continue
        if done.stdout.strip():  # logged in: cloud-init's verdict on the first boot, then the hostname
            *status, hostname = done.stdout.strip().splitlines()
            if "status: done" not in status:
                raise SystemExit("the guest's first boot ended in cloud-init errors:\n" + "\n".join(status))
            return hostname
        last = done.stderr.strip()
        time.sleep(3)
    raise SystemExit(f"no SSH login as root with the ordered key on {ip} within {seconds:.0f} s: {last}")


def guest_run(ip: str, key: Path, command: str, seconds: float = 600) -> str:
    """Run ``command`` as root over SSH with ``key`` once the guest answers (it may be booting): its output."""
    deadline = time.monotonic() + seconds
    last = ""
    while time.monotonic() < deadline:
        try:
            done = subprocess.run(
                [
                    *("ssh", *SSH_OPTIONS, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", str(key)),
                    *(f"root@{ip}", command),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            last = "no answer"
            continue
        if done.returncode == 0:
            return done.stdout.strip()
        last = done.stderr.strip()
        time.sleep(3)
    raise SystemExit(f"no SSH login as root with the ordered key on {ip} within {seconds:.0f} s: {last}")


def guest_password_login(state: dict[str, Any], ip: str, password: str) -> str:
    """Log in as root with ``password`` (OpenSSH reads it from SSH_ASKPASS): the uid it runs as."""
    askpass = Path(state["root"]) / "walk" / "askpass.sh"
    askpass.write_text("#!/bin/sh\nprintf '%s\\n' \"$WALK_GUEST_PASSWORD\"\n")
    askpass.chmod(0o700)
    done = subprocess.run(
        [
            *("ssh", *SSH_OPTIONS, "-o", "PubkeyAuthentication=no", "-o", "NumberOfPasswordPrompts=1"),
            *("-o", "PreferredAuthentications=password,keyboard-interactive", f"root@{ip}", "id -u"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={
            **os.environ,
            "SSH_ASKPASS": str(askpass),
            "SSH_ASKPASS_REQUIRE": "force",
            "DISPLAY": ":0",
            "WALK_GUEST_PASSWORD": password,
        },
    )
    if done.returncode != 0:
        raise SystemExit(f"no SSH login as root with the password on {ip}: {done.stderr.strip()}")
    return done.stdout.strip()


def sign_x402(state: dict[str, Any], requirements: dict[str, Any]) -> str:
    """The ``X-PAYMENT`` header, signed by the PyPI ``x402`` v1 client with the customer's wallet."""
    from eth_account import Account
    from x402 import x402ClientSync
    from x402.mechanisms.evm.exact.v1 import ExactEvmSchemeV1
    from x402.schemas.v1 import PaymentRequiredV1

    client = x402ClientSync()
    # the local test USDC is not among the client's known assets: allow it, as a customer of this shop would
    allowed = {"network": requirements["network"], "asset": requirements["asset"]}
    client.set_spend_controls({"allowed_assets": [allowed]})
    client.register_v1(requirements["network"], ExactEvmSchemeV1(Account.from_key(state["customer_key"])))
    payload = client.create_payment_payload(PaymentRequiredV1(x402_version=1, accepts=[requirements]))
    return base64.b64encode(json.dumps(payload.model_dump(by_alias=True, exclude_none=True)).encode()).decode()


def walk() -> None:
    state = load_state()
    results = Walk(state).run()
    out = Path(state["root"]) / "walk.json"
    out.write_text(json.dumps(results, indent=2))
    say(f"(results in {out})")


# ---- down -------------------------------------------------------------------------------------------


def ours(state: dict[str, Any]) -> list[str]:
    """Processes still running that belong to this deployment: their command line names its dirs or
    its name, or they run in the state dir (vpsshop's programs: supervisor/vpsshop.conf's directory)."""
    marks = (state["root"] + "/", state["pool_dir"] + "/")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(proc / "cwd") + "/"
        except OSError:
            continue
        if (
            any(mark in cmdline + " " for mark in marks)
            or f"vpsshop-{state['name']}" in cmdline
            or cwd.startswith(state["root"] + "/")
        ):
            found.append(f"{proc.name} {cmdline.strip()}")
    return found


def run_as_service_user() -> list[int]:
    """The processes running as user vpsshop (another deployment's, once this one's are stopped)."""
    import pwd

    uid = pwd.getpwnam(SERVICE_USER).pw_uid
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and proc.stat().st_uid == uid:
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def user_exists() -> bool:
    import pwd

    try:
        pwd.getpwnam(SERVICE_USER)
        return True
    except KeyError:
        return False


def listening(ports: dict[str, int]) -> list[str]:
    """The deployment's ports that something still listens on."""
    found = []
    for name, port in ports.items():
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                found.append(f"{name} ({port})")
    return found


def down() -> None:
    """Stop everything ``up`` started, and only that: vpsshop's programs, then libvirt's domains,
    pool and network of this deployment, supervisord with every peer it ran (libvirtd too when
    ``up`` started it), the database (and role), the PostgreSQL cluster when ``up`` started it, the
    services that installing the packages started, and the user ``up`` made."""
    state = load_state()
    root = Path(state["root"])
    uri = state["libvirt_uri"]
    say(f"tearing down the deployment in {root}")
    sock = root / "run" / "supervisor.sock"
    if sock.exists():
        supervisorctl(state, "stop", "vpsshop:*", "nginx", "prometheus", check=False)
    if libvirt_answers(uri):
        domains = run("virsh", "-c", uri, "list", "--all", "--name", quiet=True, check=False).stdout.split()
        for domain in domains:
            xml = run("virsh", "-c", uri, "dumpxml", domain, quiet=True, check=False).stdout
            if state["pool_dir"] + "/" in xml:
                run("virsh", "-c", uri, "destroy", domain, check=False, quiet=True)
                run("virsh", "-c", uri, "undefine", domain, "--nvram", check=False, quiet=True)
                say(f"- removed domain {domain}")
        run("virsh", "-c", uri, "pool-destroy", state["pool"], check=False, quiet=True)
        run("virsh", "-c", uri, "pool-undefine", state["pool"], check=False, quiet=True)
        say(f"- removed storage pool {state['pool']}")
        if state.get("guest_network"):
            run("virsh", "-c", uri, "net-destroy", state["guest_network"], check=False, quiet=True)
            run("virsh", "-c", uri, "net-undefine", state["guest_network"], check=False, quiet=True)
            say(f"- removed libvirt network {state['guest_network']}")
    shutil.rmtree(state["pool_dir"], ignore_errors=True)
    pidfile = root / "run" / "supervisord.pid"
    if pidfile.exists():
        pid = int(pidfile.read_text().strip())
        supervisorctl(state, "shutdown", check=False)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.3)
        else:
            os.kill(pid, signal.SIGKILL)
        say("- supervisord and every program it ran: stopped")
    if "database_url" in state:
        drop = f'DROP DATABASE IF EXISTS "{state["db_name"]}" WITH (FORCE)'
        if state["pg_admin_url"]:
            import psycopg

            with psycopg.connect(state["pg_admin_url"], autocommit=True) as conn:
                conn.execute(drop)
        else:
            local_psql(state, drop)
            local_psql(state, f'DROP ROLE IF EXISTS "{state["pg_role"]}"')
        say(f"- dropped database {state['db_name']}")
    if state.get("pg_started"):
        run("pg_ctlcluster", state["pg_version"], state["pg_cluster_name"], "stop", check=False)
        say(f"- PostgreSQL cluster {state['pg_version']}/{state['pg_cluster_name']}: stopped (up had started it)")
    for service in state.get("apt_started", []):
        run("service", service, "stop", check=False)
        say(f"- service {service}: stopped (installing its package had started it)")
    left = ours(state)
    for _ in range(20):
        if not left:
            break
        time.sleep(0.5)
        left = ours(state)
    if left:
        say("STILL RUNNING:\n" + "\n".join(left))
        sys.exit(1)
    say("- ps: no process of this deployment is running")
    if state.get("made_user") and user_exists():
        if run_as_service_user():
            say(f"- kept user {SERVICE_USER} (up had made it): another deployment's processes run as it")
        else:
            run("userdel", SERVICE_USER, quiet=True)
            say(f"- removed user {SERVICE_USER} (up had made it)")
    still = listening(state["ports"])
    if still:
        say("STILL LISTENING: " + ", ".join(still))
        sys.exit(1)
    say("- no port of this deployment answers")
    keep = env("KEEP_LOGS", "") == "1"
    for entry in root.iterdir():
        if keep and entry.name == "logs":
            continue
        if entry.name == "venv" and env("KEEP_VENV", "") == "1":
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    if not any(root.iterdir()):
        root.rmdir()
    say("down: nothing of the deployment is left running")


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "up":
        up()
    elif command == "_up":
        up_in_venv()
    elif command == "walk":
        if Path(sys.executable).parent != Path(load_state()["venv"]) / "bin":
            python = str(Path(load_state()["venv"]) / "bin" / "python")
            os.execv(python, [python, __file__, "walk"])
        walk()
    elif command == "down":
        state = load_state()
        python = Path(state["venv"]) / "bin" / "python"
        if Path(sys.executable) != python and python.exists():
            os.execv(str(python), [str(python), __file__, "down"])
        down()
    else:
        sys.exit("usage: refdeploy.py up|walk|down")


if __name__ == "__main__":
    main()
