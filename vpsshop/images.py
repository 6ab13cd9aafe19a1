"""Base images of the catalog's operating systems: download, verify, put on every host, report.

``vpsshop images sync`` fetches each OS's image (:class:`vpsshop.ImageSource`) once into a cache
directory, checks its checksum (given, or read from a checksum file), and hands the verified file to
the hypervisor backend, which puts it on every host of every location it serves
(:meth:`vpsshop.HypervisorBackend.install_image`) and records the version beside it. An image that
boots by direct kernel boot (the source's ``kernel_boot``) brings its kernel and initrd along: each
is downloaded and verified the same way, and all of them are checked before any reaches a host.
``vpsshop images status`` asks each host what it holds (:meth:`~vpsshop.HypervisorBackend.image_versions`).
A file whose checksum does not match is deleted and never reaches a host.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

import anyio

from vpsshop.catalog import ImageSource, OperatingSystem
from vpsshop.context import AppContext
from vpsshop.errors import PluginError
from vpsshop.hypervisor import (
    CAPABILITY_IMAGES,
    CAPABILITY_KERNEL_BOOT,
    HostImages,
    KernelBootFiles,
    kernel_boot_version,
)

CHUNK = 1 << 20
DOWNLOAD_TIMEOUT_SECONDS = 60.0
MAX_CHECKSUM_FILE_BYTES = 1 << 20


class ImageError(Exception):
    """An image could not be fetched or did not match its checksum (the message says which)."""


class Progress:
    """A progress bar on a terminal (``\\r``-redrawn), one line per step elsewhere; no dependency."""

    def __init__(self, label: str, total: int | None, out: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.out = out or sys.stderr
        self.tty = self.out.isatty()
        self.done = 0
        self._shown = -1.0

    def update(self, done: int) -> None:
        self.done = done
        now = time.monotonic()
        if self.tty and now - self._shown >= 0.2:
            self._shown = now
            self.out.write("\r" + self._line())
            self.out.flush()

    def _line(self) -> str:
        mib = self.done / (1 << 20)
        if not self.total:
            return f"{self.label}: {mib:.1f} MiB"
        share = min(1.0, self.done / self.total)
        bar = "#" * int(share * 30)
        return f"{self.label}: [{bar:<30}] {share * 100:5.1f}% {mib:.1f}/{self.total / (1 << 20):.1f} MiB"

    def finish(self) -> None:
        self.out.write(("\r" if self.tty else "") + self._line() + "\n")
        self.out.flush()


def _open(url: str) -> tuple[object, int | None]:
    response = urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_SECONDS)
    length = response.headers.get("Content-Length")
    return response, int(length) if length and length.isdigit() else None


def expected_checksum(source: ImageSource) -> str:
    """``"<kind>:<hex>"``: the manifest's own, or the line of its checksum file naming the image's file."""
    if source.checksum is not None:
        return source.checksum
    assert source.checksum_url is not None
    wanted = Path(urlsplit(source.url).path).name
    try:
        with urllib.request.urlopen(source.checksum_url, timeout=DOWNLOAD_TIMEOUT_SECONDS) as response:
            text = response.read(MAX_CHECKSUM_FILE_BYTES).decode("utf-8", "replace")
    except OSError as exc:
        raise ImageError(f"cannot read the checksum file {source.checksum_url}: {exc}") from None
    found = checksum_in_file(text, wanted, source.checksum_kind)
    if found is None:
        raise ImageError(f"the checksum file {source.checksum_url} has no {source.checksum_kind} line for {wanted}")
    return f"{source.checksum_kind}:{found}"


def checksum_in_file(text: str, wanted: str, kind: str) -> str | None:
    """The ``kind`` sum that ``text`` (a checksum file) gives for the file named ``wanted``, in lower case.

    Both layouts distributions publish count: GNU coreutils' ``<hex>  <name>`` (``*<name>`` in binary
    mode; Debian's SHA512SUMS) and BSD's ``SHA256 (<name>) = <hex>`` (``--tag``; Fedora's and
    FreeBSD's CHECKSUM files, whose other lines, such as a PGP signature around them, are ignored).
    """
    length = 64 if kind == "sha256" else 128
    bsd_prefix = f"{kind.upper()} ("
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(bsd_prefix):
            name, sep, digest = line[len(bsd_prefix) :].rpartition(") = ")
            if sep and name == wanted and len(digest) == length and _is_hex(digest):
                return digest.lower()
            continue
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("*") == wanted and len(parts[0]) == length and _is_hex(parts[0]):
            return parts[0].lower()
    return None


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdefABCDEF" for c in text)


def file_checksum(path: Path, kind: str) -> str:
    digest = hashlib.new(kind)
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return f"{kind}:{digest.hexdigest()}"


def fetch(os_: OperatingSystem, cache: Path, out: TextIO | None = None) -> tuple[Path, str]:
    """The OS's image in ``cache`` (downloaded unless a verified copy is there) and its checksum.

    The download goes to a ``.part`` file, renamed only once its checksum matches; a mismatch
    deletes it. :raises ImageError: no answer, or the checksum does not match.
    """
    source = os_.source
    assert source is not None
    expected = expected_checksum(source)
    cache.mkdir(parents=True, exist_ok=True)
    return _download(f"{os_.id} download", os_.id, source.url, expected, cache / os_.image, out), expected


def fetch_kernel_boot(os_: OperatingSystem, cache: Path, out: TextIO | None = None) -> KernelBootFiles | None:
    """The OS's kernel and initrd (its source's ``kernel_boot``) in ``cache``, each downloaded
    unless a verified copy is there and checked like the image; None when the image boots from
    its own disk. :raises ImageError: no answer, or a checksum does not match.
    """
    assert os_.source is not None
    boot = os_.source.kernel_boot
    if boot is None:
        return None
    cache.mkdir(parents=True, exist_ok=True)
    kernel_url = os_.source.boot_file_url(boot.kernel)
    kernel = _download(
        f"{os_.id} kernel download", os_.id, kernel_url, boot.kernel.checksum, cache / f"{os_.image}.kernel", out
    )
    initrd = None
    if boot.initrd is not None:
        initrd_url = os_.source.boot_file_url(boot.initrd)
        initrd = _download(
            f"{os_.id} initrd download", os_.id, initrd_url, boot.initrd.checksum, cache / f"{os_.image}.initrd", out
        )
    return KernelBootFiles(
        kernel=str(kernel),
        kernel_checksum=boot.kernel.checksum,
        cmdline=boot.cmdline,
        initrd=str(initrd) if initrd is not None else None,
        initrd_checksum=boot.initrd.checksum if boot.initrd is not None else None,
    )


def _download(label: str, os_id: str, url: str, expected: str, target: Path, out: TextIO | None) -> Path:
    """``url`` at ``target``, verified against ``expected`` (``"<kind>:<hex>"``); a verified copy
    there already (its ``.checksum`` stamp names ``expected``) is not downloaded again."""
    kind = expected.split(":", 1)[0]
    stamp = target.with_name(target.name + ".checksum")
    if target.is_file() and stamp.is_file() and stamp.read_text().strip() == expected:
        return target
    part = target.with_name(target.name + ".part")
    try:
        response, total = _open(url)
    except OSError as exc:
        raise ImageError(f"cannot download {url}: {exc}") from None
    bar = Progress(label, total, out)
    digest = hashlib.new(kind)
    done = 0
    try:
        with response, part.open("wb") as f:  # type: ignore[attr-defined]
            while block := response.read(CHUNK):  # type: ignore[attr-defined]
                f.write(block)
                digest.update(block)
                done += len(block)
                bar.update(done)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise ImageError(f"downloading {url} failed: {exc}") from None
    bar.finish()
    got = f"{kind}:{digest.hexdigest()}"
    if got != expected:
        part.unlink(missing_ok=True)
        raise ImageError(f"{os_id}: the download of {url} is corrupt or not the file named: {got}, expected {expected}")
    stamp.unlink(missing_ok=True)  # the stamp names the file only once the file is in place
    os.replace(part, target)
    stamp.write_text(expected + "\n")
    return target


@dataclass(frozen=True)
class SyncResult:
    os_id: str
    location: str
    hosts: tuple[str, ...] = ()
    """The hosts the image was written to (none: every host held it already)."""
    error: str | None = None
    skipped: str | None = None


def served_locations(ctx: AppContext) -> list[str]:
    return [loc.id for loc in ctx.catalog_data.locations if ctx.serves_location(loc.id)]


def _require_images(ctx: AppContext) -> None:
    backend = ctx.hypervisor
    if backend is None or CAPABILITY_IMAGES not in backend.capabilities:
        kind = backend.kind if backend is not None else "none"
        raise ImageError(f"the hypervisor backend ({kind}) cannot manage images")


async def sync(
    ctx: AppContext, cache: Path, out: TextIO | None = None, only: list[str] | None = None
) -> list[SyncResult]:
    """Fetch and verify each catalog OS with a source, then put it on every host of every served location.

    A corrupt download is reported for its OS and reaches no host; the other OSes carry on.
    """
    _require_images(ctx)
    backend = ctx.hypervisor
    assert backend is not None
    out = out or sys.stderr
    results = []
    for os_ in ctx.catalog_data.operating_systems:
        if only and os_.id not in only:
            continue
        if os_.source is None:
            results.append(SyncResult(os_.id, "*", skipped="no source"))
            continue
        try:
            path, version = fetch(os_, cache, out)
            boot = fetch_kernel_boot(os_, cache, out)
        except ImageError as exc:
            results.append(SyncResult(os_.id, "*", error=str(exc)))
            continue
        if boot is not None and CAPABILITY_KERNEL_BOOT not in backend.capabilities:
            error = f"the hypervisor backend ({backend.kind}) cannot take an image's kernel boot files"
            results.append(SyncResult(os_.id, "*", error=error))
            continue
        extra = {"kernel_boot": boot} if boot is not None else {}  # a backend without the parameter still works
        size = path.stat().st_size
        for location in served_locations(ctx):
            bar = Progress(f"{os_.id} -> {location}", size, out)
            try:
                hosts = await backend.install_image(
                    location, os_.image, str(path), os_.source.format, version, _progress(bar), **extra
                )
            except PluginError as exc:
                results.append(SyncResult(os_.id, location, error=str(exc)))
                continue
            if hosts:
                bar.finish()
            results.append(SyncResult(os_.id, location, hosts=tuple(hosts)))
    return results


def _progress(bar: Progress) -> Callable[[int], None]:
    return bar.update


@dataclass(frozen=True)
class ImageStatus:
    location: str
    host: str
    os_id: str
    state: str
    """``current``, ``missing`` (or held without all of the kernel boot files its source names),
    ``other version`` (held, not the catalog's, or with other kernel boot files), ``unrecorded`` (held,
    no version recorded), ``recorded`` (a version recorded; the catalog's is in a checksum file),
    ``no source`` (held, nothing to compare with), ``unreachable``."""
    version: str | None = None


async def status(ctx: AppContext) -> list[ImageStatus]:
    """What each host of each served location holds of each catalog OS."""
    _require_images(ctx)
    rows = []
    for location in served_locations(ctx):
        rows += await _location_status(ctx, location)
    return rows


STATUS_TIMEOUT_SECONDS = 5.0
"""How long :func:`status_within` waits for a location's hosts (the web console's Hosts page)."""


async def status_within(ctx: AppContext, timeout: float) -> dict[str, list[ImageStatus] | None]:
    """:func:`status` by served location, every location asked at once: a location whose hosts have not
    all answered within ``timeout`` seconds, or whose backend call failed, maps to None (the backend asks
    a location's hosts one after the other, so a host that hangs holds up its location; its call is left
    to finish on its own).

    :raises ImageError: the hypervisor backend cannot manage images.
    """
    _require_images(ctx)
    found: dict[str, list[ImageStatus] | None] = dict.fromkeys(served_locations(ctx))

    async def ask(location: str) -> None:
        with anyio.move_on_after(timeout):
            try:
                found[location] = await _location_status(ctx, location)
            except PluginError:
                pass  # as a location that does not answer

    async with anyio.create_task_group() as group:
        for location in found:
            group.start_soon(ask, location)
    return found


async def _location_status(ctx: AppContext, location: str) -> list[ImageStatus]:
    backend = ctx.hypervisor
    assert backend is not None
    hosts: list[HostImages] = await backend.image_versions(location)
    return [_state(location, host, os_) for host in hosts for os_ in ctx.catalog_data.operating_systems]


def _state(location: str, host: HostImages, os_: OperatingSystem) -> ImageStatus:
    if host.error is not None:
        return ImageStatus(location, host.host, os_.id, "unreachable")
    if os_.image not in host.images:
        return ImageStatus(location, host.host, os_.id, "missing")
    version = host.images[os_.image]
    boot_state = _boot_state(location, host, os_, version)
    if boot_state is not None:
        return boot_state
    if os_.source is None:
        return ImageStatus(location, host.host, os_.id, "no source", version)
    if version is None:
        return ImageStatus(location, host.host, os_.id, "unrecorded")
    if os_.source.checksum is None:  # the expected sum is in a checksum file: not fetched for a status
        return ImageStatus(location, host.host, os_.id, "recorded", version)
    if version != os_.source.checksum:
        return ImageStatus(location, host.host, os_.id, "other version", version)
    return ImageStatus(location, host.host, os_.id, "current", version)


def _boot_state(location: str, host: HostImages, os_: OperatingSystem, version: str | None) -> ImageStatus | None:
    """``missing`` for an image held without all of its kernel boot files, ``other version`` for one
    held with other files or another command line; None when nothing is amiss with them."""
    boot = os_.source.kernel_boot if os_.source is not None else None
    if boot is None:
        return None
    held = host.kernel_boot.get(os_.image)
    if held is None:
        return ImageStatus(location, host.host, os_.id, "missing", version)
    expected = kernel_boot_version(
        boot.kernel.checksum, boot.initrd.checksum if boot.initrd is not None else None, boot.cmdline
    )
    if held != expected:
        return ImageStatus(location, host.host, os_.id, "other version", version)
    return None


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vpsshop" / "images"
