"""Settings: a TOML file, environment overrides, and the sandbox.

Where settings come from, first match wins:

1. environment variables: ``VPSSHOP_DATABASE_URL``, ``VPSSHOP_SECRET_KEY``,
   ``VPSSHOP_ENCRYPTION_KEY``, ``VPSSHOP_OLD_ENCRYPTION_KEYS`` (comma-separated),
   ``VPSSHOP_PUBLIC_URL``, ``VPSSHOP_MODE``, and any nested setting as
   ``VPSSHOP__SECTION__KEY`` (``VPSSHOP__COINS__BTC__XPUB=zpub...``);
2. the TOML file given by ``--config``, ``VPSSHOP_CONFIG``, or ``./vpsshop.toml`` if it exists;
3. in the sandbox only, sandbox values.

With no config file the service runs as a **sandbox**: SQLite in ``./vpsshop.db``, test networks,
fixed exchange rates, and (unless ``[hypervisor] backend`` names one) the hypervisor backend with
the highest ``sandbox_priority``: the simulator. A config file is production unless it says
``mode = "sandbox"``, and production never takes a sandbox value: each missing setting is named in
the error that stops start-up.
"""

from __future__ import annotations

import base64
import os
import secrets
import tomllib
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from vpsshop.errors import ConfigError, describe_validation_error

CONFIG_ENV = "VPSSHOP_CONFIG"
DEFAULT_CONFIG_FILE = "vpsshop.toml"
SANDBOX_DATABASE_URL = "sqlite:///./vpsshop.db"
_TOP_LEVEL_ENV = {
    "VPSSHOP_DATABASE_URL": "database_url",
    "VPSSHOP_SECRET_KEY": "secret_key",
    "VPSSHOP_ENCRYPTION_KEY": "encryption_key",
    "VPSSHOP_PUBLIC_URL": "public_url",
    "VPSSHOP_MODE": "mode",
    "VPSSHOP_OLD_ENCRYPTION_KEYS": "old_encryption_keys",
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RateLimitSettings(BaseModel):
    """``[ratelimit]``: see :mod:`vpsshop.limits`."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="false: no rate limits or quotas (benchmarks; a proxy limits instead).")
    backend: Literal["auto", "database", "memory"] = Field(
        "auto", description="auto: the database on PostgreSQL (shared by all processes), memory on SQLite."
    )
    signups_per_client: int = Field(
        30, ge=1, le=1_000_000, description="POST /v1/account per client address per window."
    )
    signup_window_seconds: int = Field(3600, ge=1, le=86_400)
    auth_failures_per_client: int = Field(
        100,
        ge=1,
        le=1_000_000,
        description="Requests with an unknown or revoked API key per client address per window.",
    )
    auth_failure_window_seconds: int = Field(600, ge=1, le=86_400)
    writes_per_account: int = Field(300, ge=1, le=1_000_000, description="Authenticated writes per account per window.")
    write_window_seconds: int = Field(60, ge=1, le=86_400)
    max_servers_per_account: int = Field(100, ge=1, le=100_000, description="Servers not terminated per account.")
    max_open_topups_per_account: int = Field(20, ge=1, le=100_000, description="Pending top-ups per account.")


class MetricsSettings(BaseModel):
    """``[metrics]``: who may read ``GET /metrics`` and where the processes share their figures."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Serve GET /metrics (outside /v1) on every `vpsshop serve` port.")
    token: SecretStr = Field(
        SecretStr(""), description="When set, `Authorization: Bearer <token>` opens /metrics from any address."
    )
    allow_ips: list[str] = Field(
        default_factory=lambda: ["127.0.0.1", "::1"],
        description="TCP peers (addresses "
        "or networks) that may read /metrics without the token, unless the request "
        "passed a proxy (X-Forwarded-For / Forwarded).",
    )
    multiprocess_dir: str = Field(
        "",
        description="Directory where every serve and worker process of this host "
        "writes its figures. Default: $PROMETHEUS_MULTIPROC_DIR, else "
        "<tempdir>/vpsshop-metrics-<hash of the database's absolute location and the config file>.",
    )


class ServerSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    workers: int = Field(1, ge=1, le=64)
    max_body_bytes: int = Field(64 * 1024, ge=1024, le=16 * 1024 * 1024)
    body_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="A request body must arrive completely "
        "within this many seconds of the request's start; else 408 body_timeout.",
    )
    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="The request line and headers of a request, together, in bytes; a larger head is answered "
        "431 headers_too_large and its connection closed (vpsshop/httpserver.py).",
    )
    max_headers: int = Field(
        100, ge=10, le=10_000, description="Header lines of one request; more is 431 headers_too_large."
    )
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=300,
        description="A request's line and headers must arrive within this many seconds of the connection "
        "opening (or of their first byte, on a kept-alive connection); else 408 header_timeout and the "
        "connection is closed.",
    )
    background: bool = Field(True, description="Run background tasks inside `vpsshop serve`.")
    database_wait_seconds: float = Field(
        60,
        ge=0,
        le=3600,
        description="At start-up, wait this long for a database that does not answer yet (a host booting, "
        "PostgreSQL restarting), logging every few seconds, before giving up.",
    )
    access_log: bool = Field(True, description="One JSON line per request on stderr (vpsshop/accesslog.py).")
    forwarded_allow_ips: list[str] = Field(
        default_factory=list,
        description="Addresses of the reverse proxies whose X-Forwarded-For / X-Forwarded-Proto are believed "
        "(uvicorn's forwarded_allow_ips). Empty: the peer address is the client (sign-in limits count per client).",
    )


class McpSettings(_Section):
    """``[mcp]``: the shop's own MCP server for AI agents (``vpsshop/mcp``, docs/mcp.md)."""

    enabled: bool = Field(True, description="Serve MCP (streamable HTTP) at /mcp beside the API.")


class DashboardSettings(_Section):
    """The customer web dashboard (``vpsshop.dashboard``, docs/dashboard.md)."""

    enabled: bool = Field(True, description="Serve the dashboard pages beside the API.")
    shop_name: str = Field("vpsshop", min_length=1, max_length=60, description="The name the pages show.")
    path: str = Field("/dashboard", pattern=r"^/[a-z0-9-]+$", description="Where the pages are mounted.")
    session_idle_minutes: int = Field(60, ge=5, le=7 * 24 * 60, description="A session unused this long ends.")
    session_max_hours: int = Field(24, ge=1, le=30 * 24, description="A session ends this long after sign-in.")


class ConsoleSettings(_Section):
    """The operators' web console (``vpsshop.backoffice``, docs/operations.md): never on the API's port."""

    listen: str = Field(
        "",
        pattern=r"^$|^[^\s]+:[0-9]{1,5}$",
        description="ADDR:PORT where `vpsshop serve` also serves the console (empty: not served; "
        "`vpsshop serve --admin-listen` overrides it).",
    )
    support_limit_usd: Decimal = Field(
        Decimal(100), ge=0, le=1_000_000, description="Largest credit or debit a `support` operator may make."
    )
    session_idle_minutes: int = Field(30, ge=5, le=24 * 60, description="An operator session unused this long ends.")
    session_max_hours: int = Field(12, ge=1, le=7 * 24, description="An operator session ends this long after sign-in.")


class SigninSettings(_Section):
    """Limits on signing in with the login token: the dashboard and ``POST /v1/login`` share them."""

    failures_per_client: int = Field(
        10,
        ge=1,
        le=10_000,
        description="Failed sign-ins one client address may "
        "make per (sliding) window; then every attempt from it is refused until enough have slid out of it.",
    )
    client_window_seconds: int = Field(600, ge=1, le=86_400)
    totp_failures_per_account: int = Field(
        5,
        ge=1,
        le=1_000,
        description="Wrong two-factor codes per account "
        "per window; then that account's codes are refused until it ends.",
    )
    totp_window_seconds: int = Field(900, ge=1, le=86_400)


class LoggingSettings(_Section):
    """``[logging]``: how ``vpsshop serve`` and ``vpsshop worker`` write their log lines (standard error)."""

    format: Literal["json", "text"] = Field("json", description="json: one JSON object per line; text: for people.")
    level: Literal["debug", "info", "warning", "error"] = Field("info")


class TopupSettings(_Section):
    """``[topups]``: the payment engine (docs/payments.md)."""

    default_coin: str | None = Field(
        None,
        description="Coin used when POST /topups names none (default: the "
        "enabled coin with the highest default_priority, BTC among the default plugins).",
    )
    expiry_minutes: int = Field(60, ge=5, le=7 * 24 * 60, description="How long a top-up's rate is locked.")
    watch_interval_seconds: float = Field(15, ge=0.5, le=3600, description="Watcher pass interval.")
    push: bool = Field(
        True,
        description="Follow each node's push channel where its coin has one (a pass at once when a block or a "
        "payment arrives); false: poll every watch_interval_seconds.",
    )
    poll_min_seconds: float = Field(10, ge=0, le=3600, description="A GET checks the chain at most this often.")
    poll_timeout_seconds: float = Field(5, ge=0.1, le=60, description="How long a GET waits for that check.")
    standing_minimum_usd: Decimal = Field(
        Decimal("5"),
        ge=0,
        le=1000,
        decimal_places=2,
        description="A confirmed receipt at a standing deposit address worth less than this (with what is held "
        "there) is held, not lost, until the receipts held add up to it.",
    )


class ServersSettings(_Section):
    """``[servers]``: the server lifecycle (docs/servers.md)."""

    renew_lead_hours: float = Field(72, ge=0, le=24 * 31, description="Renew this long before expiry.")
    grace_days: float = Field(7, ge=0, le=365, description="Suspended this long, then terminated.")
    max_prepay_days: int = Field(
        1100,
        ge=31,
        le=3660,
        description="Prepay horizon: a renewal for several periods may not move expires_at further than this "
        "many days past now (default 1100: three annual or 36 monthly periods).",
    )
    provision_attempts: int = Field(5, ge=1, le=50, description="Attempts before an order is refunded.")
    retry_seconds: float = Field(30, ge=0, le=3600, description="First retry delay; doubles each attempt.")
    job_lease_seconds: float = Field(
        15,
        ge=3,
        le=86400,
        description="A running job's lease. The worker renews it every third of this while the job runs, so it "
        "runs out only when the worker is gone; then another worker takes the job over.",
    )
    boot_timeout_seconds: float = Field(
        900,
        ge=1,
        le=86400,
        description="A new server whose domain still reports starting this long after the order: a failed attempt.",
    )
    jobs_interval_seconds: float = Field(1, ge=0.05, le=600, description="How often a worker looks for jobs.")
    job_concurrency: int = Field(8, ge=1, le=256, description="Jobs one worker runs at once.")
    lifecycle_interval_seconds: float = Field(60, ge=0.05, le=3600)
    snapshots_max: int = Field(
        3,
        ge=0,
        le=100,
        description="Snapshots a server may hold at once (POST /servers/{id}/snapshots); 0 turns snapshots off.",
    )
    firewall_max_rules: int = Field(
        50, ge=1, le=500, description="Inbound firewall rules a server may have (PUT /servers/{id}/firewall)."
    )


class X402Settings(_Section):
    """``[x402]``: when an order's x402 payment moves (docs/x402.md, "Settle on readiness")."""

    settle: Literal["on_order", "on_ready"] = Field(
        "on_order",
        description="on_order: an order's x402 authorization is settled when the order is accepted; on_ready: it is "
        "verified then, held, and settled only once the server is ready (a boot that never completes settles nothing).",
    )


class TrafficSettings(_Section):
    """``[traffic]``: counting each server's network traffic against its plan's allowance
    (docs/operations.md, "Traffic")."""

    sample_seconds: float = Field(
        60,
        ge=0.05,
        le=3600,
        description="How often the worker reads every running server's interface counters (servers-traffic task).",
    )
    policy: Literal["throttle", "suspend", "none"] = Field(
        "throttle",
        description="What happens to a server past its allowance until a renewal starts a new period: throttle "
        "(its rate capped at throttle_kib_per_second), suspend (stopped as for non-payment) or none (only the event).",
    )
    throttle_kib_per_second: int = Field(
        1280,
        ge=8,
        le=10_000_000,
        description="The rate a throttled server keeps, each way, in KiB/s (1280: about 10 Mbit/s).",
    )
    plan_allowance_bytes: dict[str, int] = Field(
        default_factory=dict,
        description="Plan id -> traffic allowance per period in bytes, instead of the catalog's bandwidth_tb "
        "(10^12 bytes a TB); 0: unlimited.",
    )


class PluginSettings(_Section):
    disabled: list[str] = Field(default_factory=list, description="Plugin names never to load.")
    modules: list[str] = Field(default_factory=list, description="Extra plugin modules to import by name.")


class Settings(BaseModel):
    """Validated settings of one shop. Plugin sections stay dicts, validated by each plugin."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["sandbox", "production"]
    database_url: str
    secret_key: SecretStr = Field(description="Keys the digest (keyed BLAKE2b) under which API keys are stored.")
    encryption_key: SecretStr = Field(description="Fernet key encrypting root passwords at rest.")
    old_encryption_keys: list[SecretStr] = Field(
        default_factory=list,
        description="Earlier encryption keys, newest first: still decrypt what they "
        "encrypted until `vpsshop admin rotate-keys` has re-encrypted it with encryption_key.",
    )
    public_url: str = Field(description="Public base URL of the API, ending in /v1.")
    server: ServerSettings = Field(default_factory=ServerSettings)
    plugins: PluginSettings = Field(default_factory=PluginSettings)
    dashboard: DashboardSettings = Field(default_factory=DashboardSettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
    signin: SigninSettings = Field(default_factory=SigninSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    traffic: TrafficSettings = Field(default_factory=TrafficSettings)
    x402: X402Settings = Field(default_factory=X402Settings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    ratelimit: RateLimitSettings = Field(default_factory=RateLimitSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    catalog: dict[str, Any] = Field(default_factory=dict)
    rates: dict[str, Any] = Field(default_factory=dict)
    coins: dict[str, dict[str, Any]] = Field(default_factory=dict)
    hypervisor: dict[str, Any] = Field(default_factory=dict)
    topups: TopupSettings = Field(default_factory=TopupSettings)
    servers: ServersSettings = Field(default_factory=ServersSettings)
    events: dict[str, Any] = Field(default_factory=dict)
    dns: dict[str, Any] = Field(default_factory=dict)
    config_path: Path | None = None

    @property
    def sandbox(self) -> bool:
        return self.mode == "sandbox"

    def secret_key_bytes(self) -> bytes:
        return self.secret_key.get_secret_value().encode()

    @property
    def behind_tls(self) -> bool:
        """The public address is https: cookies are marked Secure (and named ``__Host-``)."""
        return self.public_url.lower().startswith("https://")


def _env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for env_name, key in _TOP_LEVEL_ENV.items():
        if environ.get(env_name):
            data[key] = environ[env_name]
            if key == "old_encryption_keys":  # comma-separated, newest first
                data[key] = [k.strip() for k in environ[env_name].split(",") if k.strip()]
    for env_name, value in environ.items():
        if not env_name.startswith("VPSSHOP__"):
            continue
        parts = [p for p in env_name[len("VPSSHOP__") :].split("__") if p]
        if not parts:
            continue
        parts = [p.lower() for p in parts]
        if parts[0] == "coins" and len(parts) > 1:
            parts[1] = parts[1].upper()
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _parse_env_value(value)
    return data


def _parse_env_value(value: str) -> Any:
    """Read ``true``, numbers and TOML arrays as TOML would; anything else stays a string."""
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def find_config_file(path: str | os.PathLike[str] | None, environ: Mapping[str, str]) -> Path | None:
    if path:
        return Path(path)
    if environ.get(CONFIG_ENV):
        return Path(environ[CONFIG_ENV])
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.is_file() else None


def load_settings(
    path: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Read settings from ``path`` (or where :func:`find_config_file` looks) and the environment.

    :param overrides: values applied last (tests and embedding applications).
    :raises ConfigError: naming every missing or invalid setting.
    """
    environ = os.environ if environ is None else environ
    config_path = find_config_file(path, environ)
    data: dict[str, Any] = {}
    if config_path is not None:
        try:
            data = tomllib.loads(config_path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {config_path} does not exist (run `vpsshop init` to write one)") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_path} is not valid TOML: {exc}") from None
        data.setdefault("mode", "production")
    else:
        data["mode"] = "sandbox"
    data = _merge(data, _env_overrides(environ))
    if overrides:
        data = _merge(data, overrides)
    if data.get("mode") == "sandbox":
        data = _merge(sandbox_defaults(data), data)
    data["config_path"] = config_path
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        where = f" (config file {config_path})" if config_path else ""
        raise ConfigError(describe_validation_error(exc, "") + where) from None


def sandbox_defaults(data: Mapping[str, Any]) -> dict[str, Any]:
    """The values a sandbox uses where the settings are silent."""
    database_url = data.get("database_url", SANDBOX_DATABASE_URL)
    server = data.get("server") or {}
    host = str(server.get("host") or "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):  # every interface: this machine's loopback reaches it
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    defaults: dict[str, Any] = {
        "database_url": database_url,
        # Where this sandbox is served (x402's resource URLs, /llms.txt): the host and port it listens on.
        "public_url": f"http://{host}:{server.get('port') or 8000}/v1",
        "rates": {"source": "fixed"},
        "catalog": {"source": "file"},
    }
    if not (data.get("secret_key") and data.get("encryption_key")):
        defaults.update(sandbox_secrets(database_url))
    return defaults


def sandbox_secrets(database_url: str) -> dict[str, str]:
    """Secrets of a sandbox, made once and kept in ``<database>.keys`` (mode 0600) beside it.

    The encryption key never goes into the database itself, even in the sandbox.
    """
    if database_url.startswith("sqlite:///") and database_url != "sqlite:///:memory:":
        keys_path = Path(database_url[len("sqlite:///") :] + ".keys")
    else:
        keys_path = Path("vpsshop-sandbox.keys")
    if keys_path.is_file():
        stored = tomllib.loads(keys_path.read_text())
        if stored.get("secret_key") and stored.get("encryption_key"):
            return {"secret_key": stored["secret_key"], "encryption_key": stored["encryption_key"]}
    values = {
        "secret_key": secrets.token_urlsafe(32),
        "encryption_key": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
    }
    keys_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(keys_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("# vpsshop sandbox secrets: generated, local to this sandbox database\n")
        for key, value in values.items():
            out.write(f'{key} = "{value}"\n')
    return values
