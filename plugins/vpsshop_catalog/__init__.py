"""Default catalog source: plans, locations and operating systems from a TOML file.

The file shipped beside this module (``catalog.toml``) is used unless ``[catalog.file] path``
names another, so a reseller can replace the catalog without writing code::

    [catalog]
    source = "file"
    [catalog.file]
    path = "/etc/vpsshop/catalog.toml"
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from vpsshop import CatalogData, CatalogSource, Readiness, hookimpl


class FileCatalogConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Path | None = None
    """A catalog TOML file; the shipped one when not set."""


class FileCatalog(CatalogSource[FileCatalogConfig]):
    """Reads ``[[plans]]``, ``[[locations]]`` and ``[[operating_systems]]`` tables from TOML."""

    name = "file"
    Config = FileCatalogConfig

    def source_text(self) -> str:
        path = self.config.path
        if path is None:
            return (files(__package__) / "catalog.toml").read_text()
        return Path(path).read_text()

    def load(self) -> CatalogData:
        return CatalogData.model_validate(tomllib.loads(self.source_text()))

    async def check_ready(self) -> Readiness:
        return Readiness(True, str(self.config.path or "shipped catalog"))


@hookimpl(trylast=True)
def vpsshop_register_catalog_sources() -> Iterable[type[CatalogSource[Any]]]:
    return [FileCatalog]
