"""What every plugin-provided class shares: a validated configuration and a readiness check."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, Self, TypeVar
from urllib.parse import urlsplit

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from pydantic import BaseModel, ConfigDict, ValidationError

from vpsshop.errors import ConfigError, StartupError, describe_validation_error

if TYPE_CHECKING:  # pragma: no cover
    from vpsshop.clock import Clock
    from vpsshop.db import Database


class ShopContext(Protocol):
    """What a component sees of the shop it is bound to (:meth:`Component.bind`,
    :class:`vpsshop.PluginState`): its database, its clock, and ``extras``, where plugins keep
    per-shop state under their own name. The shop's :class:`vpsshop.AppContext` is what core passes;
    this protocol names the part of it a component may rely on.

    .. versionadded:: 1.1
    """

    @property
    def db(self) -> Database: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def extras(self) -> dict[str, Any]: ...


class NoConfig(BaseModel):
    """The configuration of a component that takes no settings."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Readiness:
    """The answer of :meth:`Component.check_ready`: shown per plugin by ``GET /v1/health``."""

    ok: bool
    """Ready for real use now."""
    detail: str = ""
    sandbox_ok: bool | None = None
    """Only read in the sandbox: True when the component is not ready for real use (``ok`` is
    False: a placeholder recipient, no node) but does everything a sandbox promises (test
    addresses, payment requirements, simulated servers). None: the same as ``ok``."""
    figures: Mapping[str, float] = field(default_factory=dict)
    """Numbers an operator should watch and alert on, by name: snake_case ending in the unit
    (``relayer_gas_wei``). ``GET /metrics`` exports each as
    ``vpsshop_component_figure{kind, component, name}``; report them whether or not ``ok``."""


class ShopSecrets:
    """What a component may use of the shop's secrets, handed to its construction by core.

    A component that keeps a secret in its settings stores it encrypted with the shop's
    ``encryption_key`` (a Fernet token); :meth:`decrypt` opens it. The key itself is never
    exposed. Core passes one to :meth:`Component.from_settings`, and the component receives it
    as the ``secrets`` keyword of its constructor when it sets ``uses_secrets = True``.
    """

    def __init__(self, encryption_key: str, old_keys: tuple[str, ...] = ()) -> None:
        self._key = encryption_key
        self._old_keys = tuple(old_keys)
        """``old_encryption_keys``: still open settings encrypted before a key rotation."""

    def __repr__(self) -> str:
        return "ShopSecrets(...)"

    def decrypt(self, token: str, *, setting: str) -> str:
        """The plain text of ``token``. :raises ConfigError: not made with this shop's key
        (the message names ``setting``)."""
        try:
            keys = [Fernet(k.encode()) for k in (self._key, *self._old_keys)]
            return MultiFernet(keys).decrypt(token.encode()).decode()
        except (InvalidToken, ValueError):
            raise ConfigError(f"setting '{setting}' was not made with this shop's encryption_key") from None

    def encrypt(self, text: str) -> str:
        """A token of ``text`` that :meth:`decrypt` opens (for the plugins' encrypt commands)."""
        return Fernet(self._key.encode()).encrypt(text.encode()).decode()


ConfigT = TypeVar("ConfigT", bound=BaseModel)
"""The settings model of a component: ``class MySource(RateSource[MyConfig])``."""


class Component(Generic[ConfigT]):
    """Base of coins, hypervisor backends, catalog sources and rate sources.

    Subclasses set :attr:`Config` to a pydantic model of their settings and name the same model
    as the type parameter, so ``self.config`` is typed (``class Btc(DepositCoin[BtcConfig])``).
    Core validates the component's settings section against it: in production exactly as
    written (a missing field stops start-up naming ``section.field``), in the sandbox on top of
    :meth:`sandbox_config`.
    """

    Config: ClassVar[type[BaseModel]] = NoConfig
    """Pydantic model of this component's settings. Override when the component has settings."""

    config: ConfigT
    """The validated settings, an instance of :attr:`Config`."""

    uses_secrets: ClassVar[bool] = False
    """True: core passes a :class:`ShopSecrets` to the constructor as ``secrets=`` (None when
    the caller has none, as in a test building the component by hand)."""

    sandbox_priority: ClassVar[int | None] = None
    """In the sandbox, when the settings name no component of this kind (``[hypervisor] backend``
    unset), core picks the registered class with the highest ``sandbox_priority``. None (the
    default): never picked unless named. A component that needs nothing outside Python (the
    hypervisor simulator) sets one; one that needs a daemon or a native library does not."""

    def __init__(self, config: ConfigT, *, sandbox: bool = False) -> None:
        """Core calls this with the validated config. Override to open clients; call ``super()``."""
        self.config = config
        self.sandbox = sandbox

    @classmethod
    def sandbox_config(cls) -> dict[str, Any]:
        """Settings used in the sandbox when the reseller wrote none. Default: none.

        Override to point at test networks and local endpoints. Never consulted in production.
        """
        return {}

    @classmethod
    def from_settings(
        cls, section: dict[str, Any] | None, *, sandbox: bool, where: str, secrets: ShopSecrets | None = None
    ) -> Self:
        """Validate ``section`` (the TOML table at ``where``) and build the component.

        ``secrets`` reaches the constructor only when the class sets :attr:`uses_secrets`.
        """
        data = dict(cls.sandbox_config()) if sandbox else {}
        data.update(section or {})
        data.pop("enabled", None)
        try:
            config = cls.Config.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, where)) from None
        # The constructor as called here: ``config`` is an instance of :attr:`Config`, the model a subclass
        # also names as its ``ConfigT`` (a ClassVar cannot carry the type parameter), and a class that sets
        # uses_secrets takes ``secrets=`` as well.
        build: Callable[..., Self] = cls
        if cls.uses_secrets:
            return build(config, sandbox=sandbox, secrets=secrets)
        return build(config, sandbox=sandbox)

    def bind(self, ctx: ShopContext) -> None:
        """Called by core once the shop's context exists (after every component is built, before
        start-up hooks, before any other method runs), in every process that builds one: each
        ``vpsshop serve`` worker, ``vpsshop worker``, ``vpsshop plugins``. A component that keeps
        state in the database takes a :class:`vpsshop.PluginState` here; ``ctx.clock`` is the
        shop's clock. Must not touch the network or the database. Default: nothing."""

    async def preflight(self) -> None:
        """Refuse to start when this component cannot work at all, with the remedy in the message.

        Core awaits it for every loaded component before serving: ``vpsshop serve`` and
        ``vpsshop worker`` stop with the message in production; the sandbox logs it as a warning.
        Check what no retry can fix: a missing Python binding (name the ``pip install``), a
        missing program (name the Debian package), a node that does not answer at all (name the
        setting). A node that answers but is not ready (syncing) is :meth:`check_ready`'s
        business, not a reason to refuse. Keep it short: bound every network wait by a few
        seconds. Raise :class:`vpsshop.StartupError`. Default: nothing to check.
        """

    async def check_ready(self) -> Readiness:
        """Whether the component can serve now (its node answers, its file loaded).

        Called by ``GET /v1/health`` with a time limit; must not raise. Default: ready.
        """
        return Readiness(True)

    async def close(self) -> None:
        """Release clients and connections. Called once at shutdown. Default: nothing."""


async def require_reachable(url: str, *, setting: str, what: str, timeout: float = 5.0) -> None:
    """For :meth:`Component.preflight`: refuse to start when nothing answers at ``url`` at all.

    Opens (and closes) a TCP connection to the URL's host and port (80/443 by default). No
    connection (refused, unknown host, no route) within ``timeout`` seconds stops start-up with
    a message naming ``setting``. Whatever answers passes: whether it is the right node, synced,
    on the right chain is :meth:`Component.check_ready`'s business. The message shows the
    scheme, host and port only, never the credentials or path of the URL.

    :raises StartupError: nothing answers.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or {"https": 443, "wss": 443, "http": 80, "ws": 80}.get(parts.scheme, 80)
    except ValueError:
        raise StartupError(f"{what}: setting {setting} is not a valid URL") from None
    shown = f"{parts.scheme}://{host}:{port}"
    if not host:
        raise StartupError(f"{what}: setting {setting} has no host")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except TimeoutError:
        raise StartupError(
            f"{what} at {shown} (setting {setting}) does not answer: no connection within "
            f"{timeout:g} s. Start it, or correct {setting}."
        ) from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise StartupError(
            f"{what} at {shown} (setting {setting}) does not answer: {reason}. Start it, or correct {setting}."
        ) from None
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
