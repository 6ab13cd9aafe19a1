"""An example third-party vpsshop plugin (see README.md)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from vpsshop import ApiRoute, Call, CatalogData, CatalogSource, RateSource, hookimpl


class HelloCatalogConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Path


class HelloCatalog(CatalogSource):
    """A catalog read from a JSON file with the same layout as vpsshop's TOML catalog."""

    name = "hello"
    Config = HelloCatalogConfig

    def load(self) -> CatalogData:
        return CatalogData.model_validate(json.loads(self.config.path.read_text()))


class PeggedRates(RateSource):
    """Prices the dollar stablecoins at exactly 1 USD and nothing else."""

    name = "pegged"

    async def fetch(self, symbols: Iterable[str]) -> dict[str, Decimal]:
        return {symbol: Decimal(1) for symbol in symbols if symbol in {"USDT", "USDC"}}


class Greeting(BaseModel):
    message: str


async def hello(call: Call) -> Greeting:
    return Greeting(message=f"Hello, account {call.account_id}!")


@hookimpl
def vpsshop_register_catalog_sources() -> list[type[CatalogSource]]:
    return [HelloCatalog]


@hookimpl
def vpsshop_register_rate_sources() -> list[type[RateSource]]:
    return [PeggedRates]


@hookimpl
def vpsshop_routes(ctx) -> list[ApiRoute]:
    return [ApiRoute("GET", "/hello", hello, "Greet the caller", Greeting, tags=("hello",), operation_id="hello")]
