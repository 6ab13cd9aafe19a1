"""The reference deployment end to end: ``up``, ``walk`` and ``down`` of examples/reference-deployment,
and the unit files it ships and runs.

The fast tests read files: the supervisor programs and the systemd units a reseller installs agree
(command, user, directories, configuration, secrets file, restarts, stop timeouts), systemd accepts
the units, the deployment's rendering of the supervisor file changes only its paths and ports, and
README documents every ``REFDEPLOY_*`` setting.

The slow test runs the three commands as a user runs them, with free ports, a state dir of its own
and a PostgreSQL cluster of its own (made stopped with ``pg_createcluster``, so ``up`` starts it
and ``down`` must stop it again), reusing this checkout's installed packages and npm packages. Each walk step's
outcome is asserted from the JSON the walk leaves behind; after ``down`` no process, port, cluster
or user of the deployment may be left. ``VPSSHOP_TEST_REFDEPLOY_REAL_GUEST=1`` runs it with
``REFDEPLOY_REAL_GUEST=1`` (the Debian guest of scripts/build-test-guest.sh, logged in over SSH):
a few minutes longer, so not by default.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "examples" / "reference-deployment"
SUPERVISOR = DEPLOY / "supervisor" / "vpsshop.conf"
SYSTEMD = DEPLOY / "systemd"


def load_refdeploy() -> Any:
    spec = importlib.util.spec_from_file_location("refdeploy", DEPLOY / "refdeploy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def supervisor_programs(text: str) -> dict[str, dict[str, Any]]:
    """Each ``[program:x]`` of a supervisor file: its keys, the vpsshop argv its shell execs, the
    environment file the shell reads, and its ``environment=`` as a dict."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    programs = {}
    for section in parser.sections():
        if not section.startswith("program:"):
            continue
        keys = dict(parser[section])
        shell, flag, script = shlex.split(keys["command"])
        assert (shell, flag) == ("/bin/sh", "-c"), keys["command"]
        sourced = re.fullmatch(r"set -a; \[ ! -r (\S+) \] \|\| \. (\S+); exec (.+)", script)
        assert sourced and sourced[1] == sourced[2], script
        environment = dict(re.findall(r'(\w+)="([^"]*)"', keys["environment"]))
        programs[section.removeprefix("program:")] = {
            **keys,
            "argv": shlex.split(sourced[3]),
            "environment_file": sourced[1],
            "env": environment,
        }
    return programs


def systemd_unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


def test_supervisor_programs_and_systemd_units_agree() -> None:
    """supervisor/vpsshop.conf and systemd/*.service run the same commands the same way."""
    programs = supervisor_programs(SUPERVISOR.read_text())
    assert sorted(programs) == ["vpsshop-api-8001", "vpsshop-api-8002", "vpsshop-console", "vpsshop-worker"]
    units = {
        name: (systemd_unit(SYSTEMD / "vpsshop-api@.service"), port)
        for name, port in (("vpsshop-api-8001", "8001"), ("vpsshop-api-8002", "8002"))
    }
    units["vpsshop-worker"] = (systemd_unit(SYSTEMD / "vpsshop-worker.service"), "")
    units["vpsshop-console"] = (systemd_unit(SYSTEMD / "vpsshop-console.service"), "")
    for name, program in programs.items():
        unit, instance = units[name]
        service = unit["Service"]
        assert program["argv"] == shlex.split(service["ExecStart"].replace("%i", instance)), name
        assert program["user"] == service["User"] == service["Group"], name
        assert program["directory"] == service["WorkingDirectory"], name
        config = dict([service["Environment"].split("=", 1)])
        assert program["env"]["VPSSHOP_CONFIG"] == config["VPSSHOP_CONFIG"], name
        # systemd sets HOME and USER from the user's entry (home: the working directory, made by
        # useradd as docs/operations.md says); supervisord sets nothing, so its file does
        assert program["env"]["HOME"] == service["WorkingDirectory"] and program["env"]["USER"] == service["User"]
        assert "-" + program["environment_file"] == service["EnvironmentFile"], name  # both optional
        assert (program["autorestart"], service["Restart"]) == ("true", "always"), name
        assert program["stopwaitsecs"] == service["TimeoutStopSec"], name
        assert program["stopasgroup"] == program["killasgroup"] == "true", name  # systemd stops the cgroup
        if instance:
            assert f"--port {instance}" in service["ExecStart"].replace("%i", instance)
            assert "--admin-listen" not in program["argv"], name  # never the console on an API port
    # the console: a single-process serve of its own (docs/operations.md), its listener on loopback
    console = programs["vpsshop-console"]["argv"]
    assert console[console.index("--workers") + 1] == "1"
    assert console[console.index("--admin-listen") + 1] == "127.0.0.1:8081"
    assert console[console.index("--port") + 1] == "8003"
    group = configparser.ConfigParser(interpolation=None)
    group.read_string(SUPERVISOR.read_text())
    assert group["group:vpsshop"]["programs"].split(",") == sorted(programs)


def test_systemd_accepts_the_units(tmp_path: Path) -> None:
    """``systemd-analyze verify`` finds no unknown key or bad value in the units (with ExecStart's
    binary, which this machine does not have at /opt/vpsshop, swapped for one it has)."""
    units = (
        ("vpsshop-api@.service", "vpsshop-api@8001.service"),
        ("vpsshop-worker.service", None),
        ("vpsshop-console.service", None),
    )
    for unit, name in units:
        text = (SYSTEMD / unit).read_text().replace("/opt/vpsshop/venv/bin/vpsshop", "/bin/true")
        path = tmp_path / (name or unit)
        path.write_text(text)
        checked = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
        assert checked.returncode == 0 and not checked.stderr.strip() and not checked.stdout.strip(), checked


def test_the_deployment_installs_the_shipped_file_changing_only_paths_and_ports() -> None:
    refdeploy = load_refdeploy()
    state = {
        "root": "/srv/ref-8001",  # a port number inside a path is not a port
        "venv": "/srv/venv-8002",
        "ports": {"api1": 31001, "api2": 31002, "console_api": 31003, "console": 31081},
    }
    subs = refdeploy.unit_substitutions(state)
    assert sorted(subs) == [
        *("/etc/vpsshop", "/opt/vpsshop/venv", "/var/lib/vpsshop", "/var/log/vpsshop"),
        *("8001", "8002", "8003", "8081"),
    ]
    shipped = SUPERVISOR.read_text()
    rendered = refdeploy.render_units(shipped, state)
    programs = supervisor_programs(rendered)
    assert sorted(programs) == ["vpsshop-api-31001", "vpsshop-api-31002", "vpsshop-console", "vpsshop-worker"]
    assert programs["vpsshop-console"]["argv"][-4:] == ["--port", "31003", "--admin-listen", "127.0.0.1:31081"]
    api = programs["vpsshop-api-31001"]
    assert api["argv"] == [
        *("/srv/venv-8002/bin/vpsshop", "serve", "--no-worker", "--host", "127.0.0.1", "--port", "31001")
    ]
    assert api["environment_file"] == "/srv/ref-8001/etc/environment"
    assert api["env"] == {
        "VPSSHOP_CONFIG": "/srv/ref-8001/etc/vpsshop.toml",
        "HOME": "/srv/ref-8001/lib",
        "USER": "vpsshop",
    }
    assert api["user"] == "vpsshop" and api["stdout_logfile"] == "/srv/ref-8001/logs/api-31001.log"
    back = {v: k for k, v in subs.items()}
    pattern = re.compile("|".join(re.escape(v) for v in sorted(back, key=len, reverse=True)))
    assert pattern.sub(lambda m: back[m.group(0)], rendered) == shipped  # nothing else changed


def test_readme_documents_every_setting() -> None:
    source = (DEPLOY / "refdeploy.py").read_text()
    used = set(re.findall(r"""\benv\(\s*f?["']([A-Z_]+)""", source)) | {"PORT_<NAME>"}
    used.discard("PORT_")
    readme = (DEPLOY / "README.md").read_text()
    documented = set(re.findall(r"^\| `REFDEPLOY_([A-Z_<>]+)`", readme, re.M))
    assert used == documented, (sorted(used - documented), sorted(documented - used))


# ---- up, walk, down --------------------------------------------------------------------------------


def _running(marks: tuple[str, ...]) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(mark in cmdline for mark in marks):
                found.append(cmdline)
    return found


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _venv_for_user_vpsshop(directory: Path) -> Path:
    """A virtualenv on Debian's python3 that sees this test's installed packages (same CPython 3.11
    ABI). The deployment's programs run as user vpsshop, and this test's own venv may be built on an
    interpreter vpsshop cannot reach (pyenv's under /root); ``up`` itself makes its venv with
    Debian's python3 for that reason, but installing everything again would take minutes."""
    import site

    venv = directory / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = next(p for p in site.getsitepackages() if p.startswith(sys.prefix))
    target = next((venv / "lib").glob("python3*/site-packages"))
    (target / "vpsshop-test-overlay.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    script = (Path(sys.executable).parent / "vpsshop").read_text().split("\n", 1)[1]
    (venv / "bin" / "vpsshop").write_text(f"#!{venv}/bin/python\n{script}")
    (venv / "bin" / "vpsshop").chmod(0o755)
    directory.chmod(0o755)
    return venv


def _cluster_status(version: str, name: str) -> str:
    listed = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True).stdout
    rows = [line.split() for line in listed.splitlines()]
    return next((row[3] for row in rows if row[:2] == [version, name]), "absent")


@pytest.mark.slow
def test_up_walk_down() -> None:
    real_guest = os.environ.get("VPSSHOP_TEST_REFDEPLOY_REAL_GUEST") == "1"
    state = Path(tempfile.mkdtemp(prefix="vpsshop-refdeploy-"))
    version = max((p.name for p in Path("/usr/lib/postgresql").iterdir()), key=float)
    cluster = f"refdeploy{secrets.token_hex(3)}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        pg_port = s.getsockname()[1]
    made = subprocess.run(
        ["pg_createcluster", version, cluster, "-p", str(pg_port)], capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr
    user_before = _user_exists("vpsshop")
    venv_dir = Path(tempfile.mkdtemp(prefix="vpsshop-refdeploy-venv-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VPSSHOP", "REFDEPLOY"))}
    env.update(
        REFDEPLOY_STATE=str(state),
        REFDEPLOY_SKIP_APT="1",
        REFDEPLOY_VENV=str(_venv_for_user_vpsshop(venv_dir)),
        REFDEPLOY_NPM_DIR=str(ROOT / ".peers" / "npm"),
        REFDEPLOY_PG_CLUSTER=f"{version}/{cluster}",
        REFDEPLOY_DB_NAME="vpsshop_refdeploy",
        **({"REFDEPLOY_REAL_GUEST": "1"} if real_guest else {}),
    )
    deployment: dict = {"pool_dir": str(state / "no-pool"), "ports": {}}
    try:
        subprocess.run([str(DEPLOY / "down")], env=env, capture_output=True, timeout=120)  # nothing there: refuses
        up = subprocess.run([str(DEPLOY / "up")], env=env, capture_output=True, text=True, timeout=1800)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "- /v1/health: ok" in up.stdout, up.stdout
        for ready in ("coin USDCBASE: ready", "coin LTC: ready", "coin XMR: ready", "hypervisor libvirt: ready"):
            assert ready in up.stdout
        deployment = json.loads((state / "deployment.json").read_text())
        assert deployment["pg_started"] and _cluster_status(version, cluster) == "online"

        # vpsshop runs as the shipped supervisor file says, installed with only its paths and ports changed
        installed = (state / "supervisor" / "conf.d" / "vpsshop.conf").read_text()
        refdeploy = load_refdeploy()
        assert installed == refdeploy.render_units(SUPERVISOR.read_text(), deployment)
        programs = supervisor_programs(installed)
        ctl = ["supervisorctl", "-c", deployment["supervisord_conf"]]
        status = subprocess.run([*ctl, "status"], capture_output=True, text=True).stdout
        for program in (
            "nginx",
            "prometheus",
            "anvil",
            "litecoind",
            "monerod",
            *(f"vpsshop:{name}" for name in programs),
        ):
            assert any(line.startswith(program + " ") and "RUNNING" in line for line in status.splitlines()), status
        for name, program in programs.items():
            pid = subprocess.run([*ctl, "pid", f"vpsshop:{name}"], capture_output=True, text=True).stdout.strip()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
            assert argv[1:] == program["argv"] and Path(argv[0]).name.startswith("python"), argv  # its script
            assert Path(f"/proc/{pid}").stat().st_uid == pwd.getpwnam("vpsshop").pw_uid
        prometheus = (state / "prometheus" / "prometheus.yml").read_text()
        assert re.findall(r"'127\.0\.0\.1:(\d+)'", prometheus) == [str(deployment["ports"]["api1"])]

        walk = subprocess.run([str(DEPLOY / "walk")], env=env, capture_output=True, text=True, timeout=1800)
        assert walk.returncode == 0, walk.stdout + walk.stderr
        results = json.loads((state / "walk.json").read_text())
        assert results["x402_required"] == 402
        assert results["x402"] == "completed"
        assert results["ltc"] == "completed" and results["xmr"] == "completed"
        assert results["order"] == 201 and results["active"] == "active"
        assert re.search(r"ipv6 (2001:db8:214|fd42:214:\d+)::100,", walk.stdout), walk.stdout  # its IPv6 address
        assert results["credentials"] == 200 and results["renew"] == 200
        assert results["resize"] == "terrier", walk.stdout  # charged no more than its quote said, the job done
        assert "balance 75.0 USD" in walk.stdout  # 25 USDC + 25 in LTC + 25 in XMR, each credited once
        assert "balance 67.02 USD" in walk.stdout  # two cycles of pup (3.99) charged
        assert results["metrics"] > 0, walk.stdout
        assert results["metrics_credited_usd_total"] == 75, walk.stdout  # three top-ups of 25
        assert results["metrics_orders_total"] == 1 and results["metrics_renewals_total"] == 1, walk.stdout
        # Prometheus scrapes one port of the host, and its sums are the host's figures, not twice them
        assert results["prometheus_up"] == ["1"], walk.stdout
        totals = {"credited_usd_total": 75, "orders_total": 1, "renewals_total": 1}
        assert results["metrics_totals"] == totals and results["prometheus_sums"] == totals, walk.stdout
        # the operator's step: the console on its own TLS port, none of its pages on the public one
        assert results["console_on_api_port"] == [404, 404], walk.stdout
        assert results["console_signin"] == 303 and results["console_search"] == results["account"], walk.stdout
        assert Decimal(results["console_credit"]) == 1, walk.stdout  # the balance moved by the credit
        reason, amount = results["console_ledger"]  # the customer's ledger.credit event with the reason as memo
        assert reason == "admin_credit" and Decimal(str(amount)) == 1, walk.stdout
        assert results["console_audit"] == ["console:walk-operator", "admin_credit"], walk.stdout
        if real_guest:
            assert results["ssh_key_login"] == "walk-guest" and results["ssh_password_login"] == "0", walk.stdout
            assert results["ssh_ipv6_login"] == "walk-guest", walk.stdout  # SSH on the advertised IPv6 address
            assert results["resize_guest"] > 1500, walk.stdout  # terrier's 2 GiB, seen by free -m in the guest
            assert results["host_keys_match"] is True, walk.stdout  # the API's host keys are what the guest serves
    finally:
        down = subprocess.run([str(DEPLOY / "down")], env=env, capture_output=True, text=True, timeout=600)
        cluster_after = _cluster_status(version, cluster)
        subprocess.run(["pg_dropcluster", "--stop", version, cluster], capture_output=True, timeout=120)
        shutil.rmtree(venv_dir, ignore_errors=True)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "ps: no process of this deployment is running" in down.stdout
    assert "no port of this deployment answers" in down.stdout
    assert not _running((str(state) + "/", deployment["pool_dir"] + "/"))
    assert cluster_after == "down", down.stdout  # up started the cluster, so down stopped it
    assert _user_exists("vpsshop") == user_before, down.stdout  # the user up made is gone again
    for port in deployment["ports"].values():
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, port
    assert not state.exists()
