"""What every plugin-provided class shares: a validated configuration and a readiness check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from vpsshop.errors import ConfigError


class NoConfig(BaseModel):
    """The configuration of a component that takes no settings."""

    model_config = ConfigDict(extra="forbid")


@dataclass(frozen=True)
class Readiness:
    """The answer of :meth:`Component.check_ready`: shown per plugin by ``GET /v1/health``."""

    ok: bool
    detail: str = ""


class Component:
    """Base of coins, hypervisor backends, catalog sources and rate sources.

    Subclasses set :attr:`Config` to a pydantic model of their settings. Core validates the
    component's settings section against it: in production exactly as written (a missing field
    stops start-up naming ``section.field``), in the sandbox on top of :meth:`sandbox_config`.
    """

    Config: ClassVar[type[BaseModel]] = NoConfig
    """Pydantic model of this component's settings. Override when the component has settings."""

    def __init__(self, config: BaseModel, *, sandbox: bool = False) -> None:
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
    def from_settings(cls, section: dict[str, Any] | None, *, sandbox: bool, where: str) -> "Component":
        """Validate ``section`` (the TOML table at ``where``) and build the component."""
        data = dict(cls.sandbox_config()) if sandbox else {}
        data.update(section or {})
        data.pop("enabled", None)
        try:
            config = cls.Config.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, where)) from None
        return cls(config, sandbox=sandbox)

    async def check_ready(self) -> Readiness:
        """Whether the component can serve now (its node answers, its file loaded).

        Called by ``GET /v1/health`` with a time limit; must not raise. Default: ready.
        """
        return Readiness(True)

    async def close(self) -> None:
        """Release clients and connections. Called once at shutdown. Default: nothing."""


def describe_validation_error(exc: ValidationError, where: str) -> str:
    problems = []
    for err in exc.errors():
        name = ".".join(part for part in [where, *(str(p) for p in err["loc"])] if part)
        if err["type"] == "missing":
            problems.append(f"missing setting '{name}'")
        elif err["type"] == "extra_forbidden":
            problems.append(f"unknown setting '{name}'")
        else:
            problems.append(f"invalid setting '{name}': {err['msg']}")
    return "; ".join(problems)
