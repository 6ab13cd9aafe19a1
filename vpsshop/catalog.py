"""The catalog: what a catalog source provides, and the prices core computes from it.

A source only describes plans, locations and operating systems. Prices follow the seed's rule,
computed here so that every source prices the same way:

* monthly price = plan base price x location modifier, rounded half up to a cent;
* annual price = 10 x monthly price (two months free).
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import ClassVar, Literal
from urllib.parse import urljoin

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from vpsshop.component import Component, ConfigT
from vpsshop.money import MICROS_PER_CENT, UsdAmount, apply_modifier, micros_to_usd

CYCLES: tuple[str, ...] = ("monthly", "annual")
ANNUAL_MONTHS_CHARGED = 10
_ID = r"^[a-z0-9][a-z0-9.\-]{0,31}$"


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=_ID)
    name: str
    vcpu: int = Field(ge=1, le=256)
    memory_mib: int = Field(ge=256)
    disk_gib: int = Field(ge=5)
    bandwidth_tb: int = Field(ge=0)
    base_price_cents: int = Field(gt=0, description="Monthly price before the location modifier, in cents.")


class Location(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=_ID)
    name: str
    country: str = Field(pattern=r"^[A-Z]{2}$")
    price_modifier: Decimal = Field(gt=0, le=10, decimal_places=3)


_CHECKSUM = r"^(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$"
_ABSOLUTE_URL = r"^(https?|file)://\S+$"
_RELATIVE_PATH = r"^[A-Za-z0-9._][A-Za-z0-9._+~%\-/]*$"


class BootFile(BaseModel):
    """A kernel or initrd of :class:`KernelBootSource`: where it is downloaded from and its checksum.

    ``url`` is absolute (``https://``, ``http://``, ``file://``) or a path relative to the image's
    ``url`` (``"vmlinuz-6.1.0-28-amd64"`` beside the image, ``"../boot/vmlinuz"``).

    .. versionadded:: 1.1
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(
        min_length=1,
        max_length=2000,
        description="Where the file is downloaded from: an absolute URL, or a path relative to the image's url.",
    )
    checksum: str = Field(pattern=_CHECKSUM, description="sha256:<hex> or sha512:<hex>.")

    @field_validator("url")
    @classmethod
    def _absolute_or_relative(cls, value: str) -> str:
        if "://" in value:
            if not re.match(_ABSOLUTE_URL, value):
                raise ValueError(f"a boot file url is https://, http:// or file://, not {value!r}")
        elif not re.match(_RELATIVE_PATH, value) or value.endswith("/"):
            raise ValueError(
                f"a relative boot file url is a path relative to the image's url "
                f"(such as 'vmlinuz' or '../boot/vmlinuz'), not {value!r}"
            )
        return value


class KernelBootSource(BaseModel):
    """Direct kernel boot for an image that is a bare file system (no boot loader): the hypervisor
    loads ``kernel`` and ``initrd`` and passes ``cmdline``. ``vpsshop images sync`` downloads and
    verifies both like the image and puts them beside it on every host.

    .. versionadded:: 1.1
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kernel: BootFile = Field(description="The kernel (vmlinuz).")
    initrd: BootFile | None = Field(None, description="The initial ramdisk, if the kernel needs one.")
    cmdline: str = Field(
        "root=/dev/vda rw console=ttyS0",
        min_length=1,
        max_length=1000,
        pattern=r"^[^\x00-\x1f\x7f]*$",
        description="The kernel command line (one line).",
    )


class ImageSource(BaseModel):
    """Where ``vpsshop images sync`` fetches an operating system's base image, and how it checks it.

    Exactly one of ``checksum`` (``"sha256:<hex>"`` or ``"sha512:<hex>"``) and ``checksum_url`` (a
    checksum file such as Debian's ``SHA512SUMS`` (lines of ``<hex>  <file name>``) or Fedora's
    ``CHECKSUM`` (lines of ``SHA256 (<file name>) = <hex>``): the line naming the file of ``url`` counts,
    its kind told by ``checksum_kind``). ``kernel_boot`` (:class:`KernelBootSource`): the image boots
    by direct kernel boot, from the kernel and initrd it names.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(pattern=r"^(https?|file)://", description="Where the image file is downloaded from.")
    checksum: str | None = Field(None, pattern=_CHECKSUM, description="sha256:<hex> or sha512:<hex>.")
    checksum_url: str | None = Field(
        None, pattern=r"^(https?|file)://", description="A checksum file listing the image's file name."
    )
    checksum_kind: Literal["sha256", "sha512"] = Field("sha256", description="The kind of checksum_url's sums.")
    format: Literal["qcow2", "raw"] = "qcow2"
    kernel_boot: KernelBootSource | None = Field(
        None, description="The image boots by direct kernel boot (no boot loader): its kernel, initrd and cmdline."
    )

    @model_validator(mode="after")
    def _one_checksum(self) -> ImageSource:
        if (self.checksum is None) == (self.checksum_url is None):
            raise ValueError("an image source names exactly one of checksum and checksum_url")
        return self

    def boot_file_url(self, file: BootFile) -> str:
        """The absolute URL of a kernel or initrd: a relative one is resolved against the image's ``url``.

        .. versionadded:: 1.1
        """
        return urljoin(self.url, file.url)


class OperatingSystem(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=_ID)
    name: str
    family: str
    image: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._+\-]{0,200}$",
        description="Base image file name the hypervisor backend clones.",
    )
    source: ImageSource | None = Field(
        None, description="Where `vpsshop images sync` gets the image; none: the operator puts it on each host."
    )


class CatalogData(BaseModel):
    """What a :class:`CatalogSource` loads. Validated when the service starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plans: tuple[Plan, ...] = Field(min_length=1)
    locations: tuple[Location, ...] = Field(min_length=1)
    operating_systems: tuple[OperatingSystem, ...] = Field(min_length=1)
    snapshot_price_cents: int = Field(
        0,
        ge=0,
        le=100_000,
        description="Monthly price of one server snapshot, in cents (0: free), charged at each renewal for each "
        "snapshot the server holds then (an annual cycle: 10 months).",
    )

    @model_validator(mode="after")
    def _unique_ids(self) -> CatalogData:
        for kind in ("plans", "locations", "operating_systems"):
            ids = [item.id for item in getattr(self, kind)]
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            if dupes:
                raise ValueError(f"duplicate {kind} ids: {', '.join(dupes)}")
        return self


class CatalogSource(Component[ConfigT]):
    """Provides plans, locations and operating systems.

    ``name`` identifies the source in the ``catalog.source`` setting. :meth:`load` must be
    overridden; core calls it once at start-up and serves the result until restart.
    """

    name: ClassVar[str]

    def load(self) -> CatalogData:
        raise NotImplementedError(f"{type(self).__name__} must implement load()")


# ---- the catalog as served by GET /v1/catalog -------------------------------------------------


class PlanOut(BaseModel):
    id: str
    name: str
    vcpu: int
    memory_mib: int
    disk_gib: int
    bandwidth_tb: int
    base_price_usd: UsdAmount


class LocationOut(BaseModel):
    id: str
    name: str
    country: str
    price_modifier: UsdAmount = Field(description="Multiplies each plan's base price.")
    operating_systems: list[str] = Field(
        default_factory=list,
        description="The operating system ids orderable here now: those whose image some host of the location "
        "holds (an order for another is refused with 409 os_unavailable).",
    )


class OperatingSystemOut(BaseModel):
    id: str
    name: str
    family: str


class PriceOut(BaseModel):
    plan: str
    location: str
    monthly_usd: UsdAmount
    annual_usd: UsdAmount


class PaymentOption(BaseModel):
    coin: str
    name: str
    network: str
    method: Literal["deposit", "x402"]


class TopupLimits(BaseModel):
    min_usd: UsdAmount
    max_usd: UsdAmount


class Catalog(BaseModel):
    """Response of ``GET /v1/catalog``."""

    currency: Literal["USD"] = "USD"
    plans: list[PlanOut]
    locations: list[LocationOut]
    operating_systems: list[OperatingSystemOut]
    cycles: list[str] = Field(description="Billing cycles; annual costs 10 monthly prices.")
    pricing: list[PriceOut] = Field(description="Every plan at every location.")
    payment_options: list[PaymentOption] = Field(description="Coins this service accepts now.")
    topup_limits: TopupLimits
    snapshot_monthly_usd: UsdAmount = Field(
        Decimal(0),
        description="The monthly price of one server snapshot (0: free), added to each renewal for every snapshot "
        "the server holds when it renews (an annual cycle: 10 months).",
    )


def monthly_price_cents(plan: Plan, location: Location) -> int:
    return apply_modifier(plan.base_price_cents, location.price_modifier)


def price_cents(plan: Plan, location: Location, cycle: str) -> int:
    """The price of one billing ``cycle`` of ``plan`` at ``location`` in cents."""
    monthly = monthly_price_cents(plan, location)
    if cycle == "monthly":
        return monthly
    if cycle == "annual":
        return ANNUAL_MONTHS_CHARGED * monthly
    raise ValueError(f"unknown cycle {cycle!r}")


def snapshot_fee_micros(data: CatalogData, cycle: str) -> int:
    """What one snapshot adds to a renewal of one ``cycle``: the monthly snapshot price, an annual
    cycle 10 of them (as plans are priced)."""
    months = ANNUAL_MONTHS_CHARGED if cycle == "annual" else 1
    return data.snapshot_price_cents * months * MICROS_PER_CENT


def _usd(cents: int) -> Decimal:
    return micros_to_usd(cents * MICROS_PER_CENT)


def build_catalog(
    data: CatalogData, payment_options: list[PaymentOption], min_topup_cents: int, max_topup_cents: int
) -> Catalog:
    pricing = [
        PriceOut(
            plan=plan.id,
            location=loc.id,
            monthly_usd=_usd(price_cents(plan, loc, "monthly")),
            annual_usd=_usd(price_cents(plan, loc, "annual")),
        )
        for plan in data.plans
        for loc in data.locations
    ]
    return Catalog(
        plans=[
            PlanOut(**plan.model_dump(exclude={"base_price_cents"}), base_price_usd=_usd(plan.base_price_cents))
            for plan in data.plans
        ],
        locations=[
            LocationOut(**loc.model_dump(), operating_systems=[o.id for o in data.operating_systems])
            for loc in data.locations
        ],
        operating_systems=[
            OperatingSystemOut(**os_.model_dump(exclude={"image", "source"})) for os_ in data.operating_systems
        ],
        cycles=list(CYCLES),
        pricing=pricing,
        payment_options=payment_options,
        topup_limits=TopupLimits(min_usd=_usd(min_topup_cents), max_usd=_usd(max_topup_cents)),
        snapshot_monthly_usd=_usd(data.snapshot_price_cents),
    )
