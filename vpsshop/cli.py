"""The ``vpsshop`` command: serve, worker, init, plugins, migrate, admin."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import secrets
import signal
import sys
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vpsshop.errors import StartupError
from vpsshop.logs import CLI_HANDLER_NAME
from vpsshop.settings import Settings, load_settings
from vpsshop.version import __version__

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.actors import Operator
    from vpsshop.context import AppContext

BANNER_RULE = "=" * 78


def sandbox_banner(
    database_url: str,
    rows: list[tuple[str, str, str, bool, str]],
    problems: list[str],
    *,
    api: str = "",
    dashboard: str = "",
    mcp: str = "",
) -> str:
    """What ``vpsshop serve`` prints in the sandbox, computed from what is really loaded.

    :param rows: (kind, id, plugin, ready, detail) of every loaded component, as health reports them.
    :param problems: what the components' preflight checks found.
    """
    lines = [
        BANNER_RULE,
        f"  vpsshop {__version__} is running as a SANDBOX: nothing here is for real customers",
        f"  database    {database_url}",
    ]
    if api:
        lines.append(f"  API         {api}    web dashboard: {dashboard or 'off'}")
        lines.append(f"  MCP         {mcp or 'off'}    (for AI agents: docs/mcp.md)")
    labels = {"coin": "coin", "hypervisor": "hypervisor", "rates": "rates", "catalog": "catalog"}
    for kind, key, plugin, ready, detail in rows:
        label = labels.get(kind, kind)
        state = "" if ready else "NOT READY: "
        where = f" (plugin {plugin})" if plugin not in ("-", key) else ""
        lines.append(_wrapped(f"{label:<11} {key}{where}: {state}{detail}"))
    for problem in problems:
        lines.append(_wrapped(f"{'WARNING':<11} {problem}"))
    lines += [
        "  Coins use test networks and accept no real money. `vpsshop init` writes a production config.",
        BANNER_RULE,
    ]
    return "\n".join(lines) + "\n"


def _wrapped(text: str) -> str:
    import textwrap

    return textwrap.fill(text, width=100, initial_indent="  ", subsequent_indent=" " * 14)


async def _start_checks(ctx: AppContext) -> tuple[list[str], list[tuple[str, str, str, bool, str]]]:
    """Preflight, migrate, and (sandbox) the components' readiness for the banner; then close."""
    from vpsshop.app import preflight
    from vpsshop.readiness import component_readiness

    try:
        problems = await preflight(ctx)
        await asyncio.to_thread(ctx.db.migrate_when_it_answers, ctx.settings.server.database_wait_seconds)
        rows = []
        if ctx.settings.sandbox:
            for item, ready in await component_readiness(ctx):
                rows.append((item.kind, item.key, item.plugin, ready.ok or bool(ready.sandbox_ok), ready.detail))
        return problems, rows
    finally:
        await ctx.close()


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(getattr(args, "config", None))


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from vpsshop import metrics
    from vpsshop.app import PREFLIGHT_DONE_ENV, create_app
    from vpsshop.assembly import build_context
    from vpsshop.httpserver import http_protocol
    from vpsshop.logs import configure_logging, uvicorn_log_config

    server: dict[str, object] = {}
    if args.no_worker:
        server["background"] = False
    if args.host:  # the settings then say where this process listens (a sandbox's public_url follows)
        server["host"] = args.host
    if args.port:
        server["port"] = args.port
    settings = load_settings(args.config, overrides={"server": server} if server else None)
    host = args.host or settings.server.host
    port = args.port or settings.server.port
    workers = args.workers or settings.server.workers
    listen = args.admin_listen or settings.console.listen
    if listen and workers != 1:
        print(
            "error: the console (--admin-listen) is served by a single-process `vpsshop serve`: run it as a "
            "process of its own (vpsshop serve --no-worker --workers 1 --port P --admin-listen ADDR:PORT)",
            file=sys.stderr,
        )
        return 2
    configure_logging(settings)
    if settings.metrics.enabled:  # before the workers fork or spawn: they inherit the directory
        metrics.configure(settings)
    # Check once, here, before any worker starts: a component that cannot work stops start-up with
    # its remedy (production), the schema is migrated once, and the sandbox banner shows what loaded.
    problems, rows = asyncio.run(_start_checks(build_context(settings)))
    if settings.sandbox:
        base = f"http://{host}:{port}"
        dashboard = f"{base}{settings.dashboard.path}/" if settings.dashboard.enabled else "off"
        mcp = f"{base}/mcp" if settings.mcp.enabled else "off"
        banner = sandbox_banner(settings.database_url, rows, problems, api=f"{base}/v1", dashboard=dashboard, mcp=mcp)
        print(
            banner,
            file=sys.stderr,
            flush=True,
        )
    # X-Forwarded-For/-Proto are believed only from the proxies the settings name.
    trusted = settings.server.forwarded_allow_ips
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_level": "info",
        "access_log": False,
        # request heads bounded in size, count and time (vpsshop/httpserver.py; h11 bounds the size only)
        "http": http_protocol(settings.server),
        "h11_max_incomplete_event_size": settings.server.max_header_bytes,
        "log_config": uvicorn_log_config(settings),
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": ",".join(trusted) or None,
    }
    if listen:
        return _serve_with_console(settings, options, listen)
    if workers == 1:
        uvicorn.run(create_app(settings, check=False), **options)
        return 0
    # Several processes: each worker builds its own app from the same settings.
    if args.config:
        os.environ["VPSSHOP_CONFIG"] = str(Path(args.config).resolve())
    if args.no_worker:
        os.environ["VPSSHOP__SERVER__BACKGROUND"] = "false"
    if args.host:
        os.environ["VPSSHOP__SERVER__HOST"] = args.host
    if args.port:
        os.environ["VPSSHOP__SERVER__PORT"] = str(args.port)
    os.environ[PREFLIGHT_DONE_ENV] = "1"
    uvicorn.run("vpsshop.app:app_from_env", factory=True, workers=workers, **options)
    return 0


def _serve_with_console(settings: Settings, options: dict[str, Any], listen: str) -> int:
    """The API and the operators' console in one process, each on its own listener (two uvicorn
    servers on one event loop); when either stops, so does the other."""
    import uvicorn

    from vpsshop.app import create_app, create_console_app

    host, _, port = listen.rpartition(":")
    console_options = {**options, "host": host.strip("[]"), "port": int(port)}
    api = uvicorn.Server(uvicorn.Config(create_app(settings, check=False), **options))
    console = uvicorn.Server(uvicorn.Config(create_console_app(settings), **console_options))
    logging.getLogger("vpsshop").info("operators' console on http://%s/ (docs/operations.md)", listen)

    async def run(server: uvicorn.Server, other: uvicorn.Server) -> None:
        try:
            await server.serve()
        finally:
            other.should_exit = True

    async def both() -> None:
        await asyncio.gather(run(api, console), run(console, api))

    asyncio.run(both())
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Run the background tasks without serving HTTP."""
    from vpsshop import metrics
    from vpsshop.app import start_services, stop_services
    from vpsshop.assembly import build_context
    from vpsshop.logs import configure_logging

    settings = _settings(args)
    configure_logging(settings)
    if settings.metrics.enabled:
        metrics.configure(settings)
    ctx = build_context(settings)

    async def run() -> None:
        runner = await start_services(ctx, background=True)
        names = ", ".join(t.name for t in runner.tasks) if runner else ""
        # A log line, so that it is JSON among the JSON lines when [logging] format = "json".
        logging.getLogger("vpsshop.worker").info("vpsshop worker: running %s", names or "no background tasks")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await stop_services(ctx, runner)

    asyncio.run(run())
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from vpsshop.db import Database

    settings = _settings(args)
    db = Database(settings.database_url)
    db.migrate()
    db.dispose()
    print(f"schema of {settings.database_url.split('@')[-1]} is current")
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from vpsshop.assembly import build_context
    from vpsshop.plugins import describe_plugins

    settings = _settings(args)
    ctx = build_context(settings)
    rows = describe_plugins(ctx.pm)
    provides: dict[str, list[str]] = {}
    for kind, registered in ctx.registered.items():
        for key, reg in registered.items():
            provides.setdefault(reg.plugin, []).append(f"{kind[:-1] if kind.endswith('s') else kind}:{key}")
    for row in rows:
        row["provides"] = sorted(provides.get(row["name"], []))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        print(f"{row['name']}  ({row['module']}, {row['origin']})")
        print(f"    file:     {row['file']}")
        print(f"    hooks:    {', '.join(row['hooks']) or '-'}")
        print(f"    provides: {', '.join(row['provides']) or '-'}")
    return 0


def cmd_admin_credit(args: argparse.Namespace) -> int:
    from vpsshop import admin
    from vpsshop.actors import Operator
    from vpsshop.money import micros_to_usd, usd_to_micros

    try:
        amount = Decimal(args.amount)
        micros = usd_to_micros(amount)
    except (InvalidOperation, ValueError):
        print(f"error: AMOUNT must be a USD amount like 25 or 12.50, not {args.amount!r}", file=sys.stderr)
        return 2
    if micros <= 0:
        print("error: AMOUNT must be positive", file=sys.stderr)
        return 2
    if not args.reason.strip():
        print("error: --reason must say why", file=sys.stderr)
        return 2
    ctx = _admin_ctx(args)
    try:
        posting = admin.adjust_balance(ctx, Operator.from_environment(), args.user_id, micros, args.reason)
    except admin.AdminError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        ctx.db.dispose()
    entry = posting.entry
    print(
        f"credited {micros_to_usd(micros)} USD to account {args.user_id} "
        f"(ledger entry {entry.id}); balance now {micros_to_usd(entry.balance_after_micros)} USD"
    )
    return 0


def cmd_backup(args: argparse.Namespace) -> int:
    """Write a backup of the configured database (see vpsshop/backup.py)."""
    import time

    from vpsshop.backup import BackupError, backup

    settings = _settings(args)
    output = Path(args.output or time.strftime("vpsshop-backup-%Y%m%dT%H%M%SZ.dump", time.gmtime()))
    try:
        print(backup(settings.database_url, output))
    except BackupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        "The backup holds no keys: keep secret_key and encryption_key (the settings file) backed up "
        "separately, or the restored shop cannot reveal root passwords.",
        file=sys.stderr,
    )
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    """Restore a backup into the configured database, then migrate it."""
    from vpsshop.backup import BackupError, restore

    settings = _settings(args)
    try:
        print(restore(settings.database_url, Path(args.backup), replace=args.yes))
    except BackupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


class NoShopDatabase(Exception):
    """An admin command found no shop database where the settings point; it never makes one."""


def _no_database_message(where: str) -> str:
    return (
        f"no vpsshop database at {where}: admin commands work on an existing shop and never create a "
        "database. Name the shop's config with --config FILE or VPSSHOP_CONFIG=FILE (or its database with "
        "VPSSHOP_DATABASE_URL), or run the command in the directory of the sandbox's vpsshop.db."
    )


def _existing_shop_settings(args: argparse.Namespace) -> Settings:
    """The settings of an existing shop, for the admin commands.

    :raises NoShopDatabase: the database the settings name does not exist or holds no shop. Checked
        before the settings are read when the sandbox's default database would be used, so that not
        even the sandbox's key file is written.
    """
    from vpsshop.settings import SANDBOX_DATABASE_URL, find_config_file

    env_url = os.environ.get("VPSSHOP_DATABASE_URL", "")
    if find_config_file(getattr(args, "config", None), os.environ) is None:
        url = env_url or SANDBOX_DATABASE_URL
        if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).is_file():
            raise NoShopDatabase(_no_database_message(url))
    settings = _settings(args)
    url = settings.database_url
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).is_file():
        raise NoShopDatabase(_no_database_message(url))
    import sqlalchemy as sa

    shown = sa.make_url(url).render_as_string(hide_password=True)
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            found = sa.inspect(conn).has_table("accounts")
    except sa.exc.OperationalError as exc:
        raise NoShopDatabase(f"cannot open the database at {shown}: {type(exc.orig).__name__}") from None
    finally:
        engine.dispose()
    if not found:
        raise NoShopDatabase(_no_database_message(shown))
    return settings


def _admin_ctx(args: argparse.Namespace) -> AppContext:
    from vpsshop.assembly import build_context

    ctx = build_context(_existing_shop_settings(args))
    ctx.db.migrate()
    return ctx


def _usd_micros(text: str) -> int | None:
    from vpsshop.money import usd_to_micros

    try:
        micros = usd_to_micros(Decimal(text))
    except (InvalidOperation, ValueError):
        return None
    return micros if micros > 0 else None


def cmd_admin(args: argparse.Namespace) -> int:
    """``vpsshop admin lookup|debit|suspend|unsuspend|terminate|refund|retry-job|cancel-job|stuck|rescan|audit``."""
    from vpsshop import admin
    from vpsshop.actors import Operator

    command = args.admin_command
    if command == "debit":
        micros = _usd_micros(args.amount)
        if micros is None:
            print(f"error: AMOUNT must be a positive USD amount like 25 or 12.50, not {args.amount!r}", file=sys.stderr)
            return 2
    ctx = _admin_ctx(args)
    operator = Operator.from_environment()
    try:
        if command == "lookup":
            print(json.dumps(admin.lookup(ctx, args.query), indent=2, default=str))
        elif command == "debit":
            from vpsshop.money import micros_to_usd

            assert micros is not None  # checked above, before the context was built
            posting = admin.adjust_balance(ctx, operator, args.user_id, -micros, args.reason)
            print(f"debited account {args.user_id}: balance {micros_to_usd(posting.entry.balance_after_micros)} USD")
        elif command in ("suspend", "unsuspend", "terminate"):
            print(admin.set_server_state(ctx, operator, args.server_id, command, args.reason))
        elif command == "refund":
            print(admin.set_server_state(ctx, operator, args.server_id, "terminate", args.reason, refund_unused=True))
        elif command in ("retry-job", "cancel-job"):
            print(admin.job_action(ctx, operator, args.job_id, command.split("-")[0], args.reason))
        elif command == "stuck":
            print(json.dumps(admin.stuck(ctx, args.minutes), indent=2, default=str))
        elif command == "rescan":
            print(asyncio.run(_rescan(ctx, operator, args)))
        elif command == "audit":
            print(json.dumps(admin.audit_log(ctx, args.limit), indent=2, default=str))
        elif command == "migrate":
            print(admin.migrate_server(ctx, operator, args.server_id, args.to, args.reason))
        elif command == "host":
            _admin_host(ctx, operator, args)
    except admin.AdminError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        from vpsshop.errors import ApiError

        if isinstance(exc, ApiError):
            print(f"error: {exc}", file=sys.stderr)
            return 1
        raise
    finally:
        ctx.db.dispose()
    return 0


async def _rescan(ctx: AppContext, operator: Operator, args: argparse.Namespace) -> str:
    from vpsshop import admin

    try:
        return await admin.rescan(ctx, operator, args.coin, args.from_height, args.to_height, args.reason)
    finally:
        await ctx.close()


def _new_password(args: argparse.Namespace) -> str:
    import getpass

    if args.password_stdin:
        return sys.stdin.readline().rstrip("\n")
    first = getpass.getpass("Password (12 characters or more): ")
    if getpass.getpass("Again: ") != first:
        raise SystemExit("error: the passwords differ")
    return first


def _admin_host(ctx: AppContext, operator: Any, args: argparse.Namespace) -> None:
    """``vpsshop admin host drain|undrain|evacuate HOST`` and ``host list``."""
    from vpsshop import admin

    command = args.host_command
    if command == "list":
        print(json.dumps(admin.drained_hosts(ctx), indent=2, default=str))
    elif command == "evacuate":
        print("\n".join(admin.evacuate_host(ctx, operator, args.host, args.reason)))
    else:
        print(admin.drain_host(ctx, operator, args.host, args.reason, drained=command == "drain"))


def cmd_admin_operator(args: argparse.Namespace) -> int:
    """``vpsshop admin operator add|list|disable|reset``: the web console's operators (vpsshop/operators.py)."""
    from vpsshop import operators
    from vpsshop.actors import Operator
    from vpsshop.admin import AdminError

    action = args.operator_command
    password = _new_password(args) if action in ("add", "reset") else ""
    ctx = _admin_ctx(args)
    by = Operator.from_environment()
    try:
        if action == "list":
            print(json.dumps(operators.list_operators(ctx), indent=2, default=str))
            return 0
        if action == "disable":
            ended = operators.disable_operator(ctx, by, args.name, args.reason)
            print(f"operator {args.name} disabled; {ended} session(s) ended")
            return 0
        if action == "add":
            enrolment = operators.add_operator(ctx, by, args.name, args.role, password)
        else:
            enrolment = operators.reset_operator(ctx, by, args.name, password, args.reason)
    except AdminError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        ctx.db.dispose()
    print(f"operator {enrolment.name} ({enrolment.role}): add this to their authenticator app (shown once)")
    print(f"TOTP secret: {enrolment.secret}")
    print(f"TOTP URI:    {enrolment.uri}")
    return 0


def cmd_admin_rotate_keys(args: argparse.Namespace) -> int:
    """Re-encrypt every stored secret with ``encryption_key`` (see vpsshop/encryption.py)."""
    from vpsshop.actors import Operator
    from vpsshop.admin import audit
    from vpsshop.assembly import build_context
    from vpsshop.encryption import rotate_stored_secrets

    ctx = build_context(_existing_shop_settings(args))
    try:
        ctx.db.migrate()
        counts = rotate_stored_secrets(ctx)
        with ctx.db.session() as session:
            audit(
                session,
                Operator.from_environment(),
                "rotate_keys",
                "encryption_key",
                args.reason.strip() or "key rotation",
                counts,
            )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        ctx.db.dispose()
    for column, count in counts.items():
        print(f"{column}: {count} secrets re-encrypted with encryption_key")
    print(
        "Every stored secret now decrypts with encryption_key alone: old_encryption_keys can be removed "
        "(restart every serve and worker process after removing them)."
    )
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if path.exists() and not args.force:
        print(f"error: {path} exists; pass --force to overwrite it", file=sys.stderr)
        return 1
    text = PRODUCTION_TEMPLATE.format(
        secret_key=secrets.token_urlsafe(32),
        encryption_key=base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    print(f"wrote {path} (mode 0600). Fill in every value marked REQUIRED, then: vpsshop serve --config {path}")
    return 0


PRODUCTION_TEMPLATE = """\
# vpsshop production configuration (written by `vpsshop init`).
#
# A config file is production unless it says mode = "sandbox". Production never falls back to
# sandbox values: every missing setting stops start-up with an error naming it.
# Any value can be overridden from the environment: VPSSHOP_DATABASE_URL, VPSSHOP_SECRET_KEY,
# VPSSHOP_ENCRYPTION_KEY, VPSSHOP_PUBLIC_URL, or VPSSHOP__SECTION__KEY for nested ones
# (VPSSHOP__COINS__BTC__XPUB=zpub...). Keep this file private: it holds secrets (mode 0600).

mode = "production"

# REQUIRED. PostgreSQL for production: postgresql+psycopg://user:password@host:5432/vpsshop
database_url = "postgresql+psycopg://vpsshop@127.0.0.1:5432/vpsshop"

# REQUIRED. The public address of the API, ending in /v1 (used in payment requirements).
public_url = "https://api.example.com/v1"

# Generated for you. secret_key keys the hashes of API keys: changing it invalidates every key.
secret_key = "{secret_key}"
# encryption_key encrypts root passwords, user data, two-factor and webhook signing secrets at rest
# (a Fernet key). Back it up apart from the database. To replace it, see docs/operations.md
# ("Encryption key rotation"): the old key goes into old_encryption_keys until `vpsshop admin
# rotate-keys` has re-encrypted everything.
encryption_key = "{encryption_key}"
# old_encryption_keys = []  # earlier keys, newest first, during a rotation

[server]
host = "127.0.0.1"          # put a TLS-terminating proxy in front
port = 8000
workers = 2
max_body_bytes = 65536
body_timeout_seconds = 10   # a request body must arrive within this (slow clients get 408)
max_header_bytes = 32768    # request line and headers together (larger: 431, connection closed)
max_headers = 100           # header lines per request (more: 431)
header_timeout_seconds = 10 # the request line and headers must arrive within this (else 408, closed)
background = true           # run watchers and provisioning inside `serve`; false if you run `vpsshop worker`
access_log = true           # one JSON line per request on stderr (no client address, no headers)
# The reverse proxies whose X-Forwarded-For / X-Forwarded-Proto are believed: rate limits then count
# per customer address, and cookies are Secure behind https. Empty: the TCP peer is the client.
forwarded_allow_ips = ["127.0.0.1"]

[logging]
format = "json"             # one JSON object per line on stderr; "text" for reading by eye
level = "info"              # debug, info, warning, error

[metrics]
# GET /metrics (Prometheus) on every `serve` port, never under /v1.
enabled = true
# token = ""                # set it: then `Authorization: Bearer <token>` opens /metrics from anywhere
allow_ips = ["127.0.0.1", "::1"]   # without the token: only these peers, and only not through a proxy
# Where the serve and worker processes of this host share their figures: the same for every unit, and
# writable by the service user (docs/operations.md, "Metrics"). Default: a directory under /tmp, which
# systemd's PrivateTmp gives each unit its own copy of.
# multiprocess_dir = "/run/vpsshop/metrics"

[ratelimit]
# 429 rate_limited with Retry-After over these (docs/operations.md, "Rate limits and quotas").
enabled = true
backend = "auto"            # auto: counted in PostgreSQL (shared by every process), in memory on SQLite
signups_per_client = 30     # POST /v1/account per client address per signup_window_seconds
signup_window_seconds = 3600
auth_failures_per_client = 100   # requests with an unknown or revoked API key per address per window
auth_failure_window_seconds = 600
writes_per_account = 300    # authenticated POST/PUT/PATCH/DELETE per account per write_window_seconds
write_window_seconds = 60
max_servers_per_account = 100
max_open_topups_per_account = 20

[signin]
# Signing in with the login token (dashboard and POST /v1/login).
failures_per_client = 10    # per client_window_seconds
client_window_seconds = 600
totp_failures_per_account = 5   # wrong two-factor codes per totp_window_seconds
totp_window_seconds = 900

[plugins]
disabled = []               # plugin names never to load (also: VPSSHOP_BLOCK_PLUGINS=a,b)
modules = []                # extra plugin modules to import by name

[catalog]
source = "file"             # the catalog shipped with vpsshop, or:
# [catalog.file]
# path = "/etc/vpsshop/catalog.toml"

[rates]
# REQUIRED. Where exchange rates come from: "kraken" (public ticker, no key; prices every classic
# coin), "coinbase" (no XMR), or "fixed" (prices set by hand in [rates.fixed]).
source = "kraken"
max_age_seconds = 600       # no price younger than this: new top-ups are refused (rate_unavailable)
# [rates.fixed]
# prices = {{ BTC = "60000", XMR = "150" }}

[topups]
expiry_minutes = 60         # how long a top-up's rate is locked; late payments are still credited
# default_coin = "BTC"      # coin of POST /topups without "coin" (docs/payments.md)

[events]
# Webhooks (docs/events.md): https only, never to private, loopback or link-local addresses.
# allowed_networks = []     # CIDR networks webhooks may reach anyway, e.g. ["10.20.0.0/16"]
# retry_window_hours = 72   # how long a failing delivery is retried
# disable_after_hours = 120 # an endpoint failing this long is disabled (the account gets webhook.disabled)

[hypervisor]
# REQUIRED. The backend that runs servers.
backend = "libvirt"

# Coins: production accepts exactly the coins that have a [coins.CODE] table here.
# Each coin plugin documents its settings (docs/payments.md). For example:
# [coins.BTC]
# xpub = "zpub..."          # watch-only: the server never holds a spending key
# rpc_url = "http://user:pass@127.0.0.1:8332"
# confirmations = 2
#
# USDC on Base paid by x402 (docs/x402.md): no deposit address; the customer's client signs an
# authorization and the shop settles it during the request. A shop that takes only USDCBASE still
# needs [rates] above (e.g. source = "fixed" with prices = {{ USDC = "1" }}) and [hypervisor].
# [coins.USDCBASE]
# mode = "direct"           # the shop settles from its relayer wallet (or "facilitator")
# network = "base"          # or "base-sepolia" for testing
# pay_to = "0xYourShopAddress"                # receives the USDC; keep its key off this machine
# rpc_url = "https://mainnet.base.org"        # a Base JSON-RPC endpoint
# relayer_key_env = "VPSSHOP_X402_RELAYER_KEY"  # env var holding the relayer key (pays gas only), or
# relayer_key_encrypted = "gAAAA..."          # from: python -m vpsshop_x402 encrypt-relayer-key
# # mode = "facilitator" instead: facilitator_url = "https://your-facilitator.example" (rpc_url still required)
"""


DEFAULT_MCP_API_URL = "http://127.0.0.1:8000/v1"


def cmd_mcp(args: argparse.Namespace) -> int:
    """Serve the MCP tools; the customer's API key comes from $VPSSHOP_API_KEY (never an argument:
    command lines are visible to every user of the machine)."""
    from vpsshop.mcp import bridge

    api_url = args.api_url or os.environ.get("VPSSHOP_API_URL") or DEFAULT_MCP_API_URL
    api_key = os.environ.get("VPSSHOP_API_KEY") or None
    if api_key is None:
        logging.getLogger("vpsshop.mcp").warning(
            "VPSSHOP_API_KEY is not set: only get_catalog, create_account and sign_in work"
        )
    bridge.run(api_url, api_key, args.transport, args.host, args.port, mcp_url=args.mcp_url)
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    """``vpsshop images sync|status``: the catalog's base images on every host (vpsshop/images.py)."""
    from vpsshop import images
    from vpsshop.assembly import build_context

    ctx = build_context(_settings(args))

    async def run() -> int:
        try:
            if args.images_command == "sync":
                cache = Path(args.cache) if args.cache else images.default_cache()
                results = await images.sync(ctx, cache, only=args.os or None)
                failed = 0
                for r in results:
                    if r.error:
                        failed += 1
                        print(f"{r.os_id}\t{r.location}\tREFUSED\t{r.error}")
                    elif r.skipped:
                        print(f"{r.os_id}\t{r.location}\tskipped\t{r.skipped}")
                    else:
                        print(f"{r.os_id}\t{r.location}\tok\t{', '.join(r.hosts) or 'every host had it'}")
                return 1 if failed else 0
            rows = await images.status(ctx)
            if args.json:
                print(json.dumps([row.__dict__ for row in rows], indent=2))
            else:
                for row in rows:
                    print(f"{row.location}\t{row.host}\t{row.os_id}\t{row.state}\t{row.version or ''}")
            return 1 if any(row.state in ("missing", "unreachable") for row in rows) else 0
        except images.ImageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            await ctx.close()

    return asyncio.run(run())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vpsshop", description="Run a prepaid crypto VPS shop.")
    parser.add_argument("--version", action="version", version=f"vpsshop {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", help="TOML config file (default: $VPSSHOP_CONFIG, ./vpsshop.toml, else sandbox)")
        return p

    serve = with_config(sub.add_parser("serve", help="serve the API (a sandbox when there is no config file)"))
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--workers", type=int)
    serve.add_argument("--no-worker", action="store_true", help="do not run background tasks in this process")
    serve.add_argument(
        "--admin-listen",
        metavar="ADDR:PORT",
        help="also serve the operators' web console there, never on the API's port (default [console] listen)",
    )
    serve.set_defaults(func=cmd_serve)

    worker = with_config(sub.add_parser("worker", help="run background tasks (chain watchers, provisioning)"))
    worker.set_defaults(func=cmd_worker)

    init = sub.add_parser("init", help="write a commented production config")
    init.add_argument("path", nargs="?", default="vpsshop.toml")
    init.add_argument("--force", action="store_true")
    init.set_defaults(func=cmd_init)

    plugins = with_config(sub.add_parser("plugins", help="list loaded plugins, where they come from, their hooks"))
    plugins.add_argument("--json", action="store_true")
    plugins.set_defaults(func=cmd_plugins)

    migrate = with_config(sub.add_parser("migrate", help="bring the database schema up to date"))
    migrate.set_defaults(func=cmd_migrate)

    backup = with_config(sub.add_parser("backup", help="back up the database (pg_dump / SQLite backup API)"))
    backup.add_argument("-o", "--output", help="file to write (default vpsshop-backup-<UTC time>.dump)")
    backup.set_defaults(func=cmd_backup)
    restore = with_config(sub.add_parser("restore", help="restore a backup into the configured database"))
    restore.add_argument("backup", help="a file written by `vpsshop backup`")
    restore.add_argument("--yes", action="store_true", help="replace a database that already holds a shop")
    restore.set_defaults(func=cmd_restore)

    mcp = sub.add_parser(
        "mcp",
        help="a deployment's MCP tools over stdio for AI agents, with a customer key",
        description="Serve a vpsshop deployment's Model Context Protocol tools (every customer operation of "
        "its API) over stdio, for an agent host that starts a command: each call is relayed to the deployment's "
        "own MCP server (/mcp) with the customer's API key from $VPSSHOP_API_KEY. See docs/mcp.md.",
    )
    mcp.add_argument(
        "--api-url",
        default=None,
        help=f"the deployment's API base URL ending in /v1 (default: $VPSSHOP_API_URL, else {DEFAULT_MCP_API_URL})",
    )
    mcp.add_argument(
        "--mcp-url",
        default=None,
        help="the deployment's MCP endpoint (default: the API base URL's /v1 replaced by /mcp)",
    )
    mcp.add_argument(
        "--transport",
        choices=["stdio", "streamable-http"],
        default="stdio",
        help="stdio (default: the agent starts this command) or streamable-http",
    )
    mcp.add_argument("--host", default="127.0.0.1", help="streamable-http: address to listen on (default loopback)")
    mcp.add_argument("--port", type=int, default=8765, help="streamable-http: port (default 8765); path /mcp")
    mcp.set_defaults(func=cmd_mcp)

    images_ = sub.add_parser("images", help="the catalog's OS base images on every hypervisor host")
    images_sub = images_.add_subparsers(dest="images_command", required=True)
    sync = with_config(images_sub.add_parser("sync", help="download, verify and upload each OS image to every host"))
    sync.add_argument("--cache", help="download cache directory (default ~/.cache/vpsshop/images)")
    sync.add_argument("--os", action="append", help="only this catalog OS id (repeatable)")
    sync.set_defaults(func=cmd_images)
    status = with_config(
        images_sub.add_parser("status", help="which host holds which image version; exit 1 if any lacks one")
    )
    status.add_argument("--json", action="store_true", help="one JSON object per host and OS")
    status.set_defaults(func=cmd_images)

    admin = sub.add_parser("admin", help="support tasks")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True)
    credit = with_config(admin_sub.add_parser("credit", help="credit an account through the ledger"))
    credit.add_argument("user_id", type=int)
    credit.add_argument("amount", help="USD, e.g. 25 or 12.50")
    credit.add_argument("--reason", required=True, help="why (kept in the ledger entry)")
    credit.set_defaults(func=cmd_admin_credit)
    rotate = with_config(
        admin_sub.add_parser(
            "rotate-keys", help="re-encrypt every stored secret with encryption_key (old keys in old_encryption_keys)"
        )
    )
    rotate.add_argument("--reason", default="key rotation", help="why (kept in the audit log)")
    rotate.set_defaults(func=cmd_admin_rotate_keys)
    lookup = with_config(
        admin_sub.add_parser(
            "lookup", help="find an account by id, API key prefix, top-up ref, deposit address or tx hash"
        )
    )
    lookup.add_argument("query")
    debit = with_config(admin_sub.add_parser("debit", help="debit an account through the ledger"))
    debit.add_argument("user_id", type=int)
    debit.add_argument("amount", help="USD, e.g. 25 or 12.50")
    for name, what in (
        ("suspend", "suspend an active server (job: suspend)"),
        ("unsuspend", "resume a suspended server (job: resume)"),
        ("terminate", "terminate a server (job: destroy); no refund"),
        ("refund", "terminate a server and refund its unused prepaid time (all of it while provisioning)"),
    ):
        p = with_config(admin_sub.add_parser(name, help=what))
        p.add_argument("server_id", type=int)
        p.add_argument("--reason", required=True, help="why (kept in the audit log)")
        p.set_defaults(func=cmd_admin)
    for name, what in (
        ("retry-job", "queue a failed or stuck job again, now (never one running under a live lease)"),
        ("cancel-job", "cancel a queued or failed job (a provisioning job: its server is terminated and refunded)"),
    ):
        p = with_config(admin_sub.add_parser(name, help=what))
        p.add_argument("job_id", type=int)
        p.add_argument("--reason", required=True, help="why (kept in the audit log)")
        p.set_defaults(func=cmd_admin)
    debit.add_argument("--reason", required=True, help="why (kept in the ledger entry and the audit log)")
    stuck = with_config(
        admin_sub.add_parser(
            "stuck",
            help="list jobs, servers left provisioning, seen payments and x402 settlements waiting too long",
        )
    )
    stuck.add_argument("--minutes", type=float, default=30)
    audit = with_config(admin_sub.add_parser("audit", help="show the latest admin audit entries"))
    audit.add_argument("--limit", type=int, default=50)
    rescan = with_config(
        admin_sub.add_parser(
            "rescan",
            help="scan a block range of a coin again for payments to the shop's addresses (never credits twice)",
        )
    )
    rescan.add_argument("coin", help="coin code, e.g. LTC (its whole scan group is re-scanned)")
    rescan.add_argument("from_height", type=int, help="first block to read again")
    rescan.add_argument("to_height", type=int, nargs="?", help="last block to read again (default: the tip)")
    rescan.add_argument("--reason", default="re-scan of blocks", help="why (kept in the audit log)")
    for p in (lookup, debit, stuck, audit, rescan):
        p.set_defaults(func=cmd_admin)
    migrate_ = with_config(
        admin_sub.add_parser("migrate", help="move a server to another host of its location (job: migrate)")
    )
    migrate_.add_argument("server_id", type=int)
    migrate_.add_argument("--to", metavar="HOST", help="the target host (default: another undrained host)")
    migrate_.add_argument("--reason", default="maintenance", help="why (kept in the audit log)")
    host = admin_sub.add_parser("host", help="hypervisor hosts: drain, undrain, evacuate, list the drained")
    host_sub = host.add_subparsers(dest="host_command", required=True)
    for name, what in (
        ("drain", "place no new server on HOST (its servers stay until moved)"),
        ("undrain", "place new servers on HOST again"),
        ("evacuate", "drain HOST and queue a move of each of its servers to the location's other hosts"),
    ):
        p = with_config(host_sub.add_parser(name, help=what))
        p.add_argument("host", help="the host's name as servers record it (hypervisor settings: name or uri)")
        p.add_argument("--reason", default="maintenance", help="why (kept in the audit log)")
        p.set_defaults(func=cmd_admin)
    with_config(
        host_sub.add_parser("list", help="the drained hosts and how many servers each still holds")
    ).set_defaults(func=cmd_admin)
    migrate_.set_defaults(func=cmd_admin)
    operator = admin_sub.add_parser("operator", help="the web console's operators: add, list, disable, reset")
    operator_sub = operator.add_subparsers(dest="operator_command", required=True)
    add = with_config(operator_sub.add_parser("add", help="a new operator (password, then a TOTP secret to enrol)"))
    add.add_argument("name")
    add.add_argument("--role", choices=["owner", "support"], required=True)
    reset = with_config(operator_sub.add_parser("reset", help="a new password and TOTP secret; enabled again"))
    reset.add_argument("name")
    reset.add_argument("--reason", default="reset", help="why (kept in the audit log)")
    for p in (add, reset):
        p.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
    disable = with_config(operator_sub.add_parser("disable", help="disable an operator; their sessions end"))
    disable.add_argument("name")
    disable.add_argument("--reason", required=True, help="why (kept in the audit log)")
    listed = with_config(operator_sub.add_parser("list", help="the operators, their role and state"))
    for p in (add, reset, disable, listed):
        p.set_defaults(func=cmd_admin_operator)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:  # formatted as [logging] says once settings are read
        handler.set_name(CLI_HANDLER_NAME)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except StartupError as exc:
        print(f"vpsshop: cannot start: {exc}", file=sys.stderr)
        return 2
    except NoShopDatabase as exc:  # an admin command found no shop where the settings point
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
