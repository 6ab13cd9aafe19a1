"""Base images in a host's storage pool, written and read through libvirt's storage streams (no SSH).

Each base image ``<image>`` a sync put there has a record beside it: a small volume
``<image>.vpsshop-version`` holding the checksum it was verified against (``sha256:<hex>``). The pool
is the truth: the record is written only after the image's upload has finished, so a host holding
an image without its record got it some other way (by hand, or an upload cut short and not
cleaned up), and a sync checks such a file by reading it back before it records it.

A base image that is there is never replaced: the disks of the servers made from it are qcow2
overlays on it, which a new version under the same name would corrupt. A new version takes a new
image file name in the catalog.

An image that boots by direct kernel boot (the catalog source's ``kernel_boot``) has its kernel and
initrd beside it, ``<image>.vpsshop-kernel`` and ``<image>.vpsshop-initrd``, and a record of them,
``<image>.vpsshop-boot`` (JSON: their checksums, the command line, the image's format). They are
uploaded before the image and recorded last, so a host holding the image holds its boot files; like
the image, files recorded there are never replaced by others (a running server boots from them
again at its next start).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vpsshop import KernelBootFiles, PluginError

RECORD_SUFFIX = ".vpsshop-version"
KERNEL_SUFFIX = ".vpsshop-kernel"
INITRD_SUFFIX = ".vpsshop-initrd"
BOOT_SUFFIX = ".vpsshop-boot"
_NOT_IMAGES = (RECORD_SUFFIX, KERNEL_SUFFIX, INITRD_SUFFIX, BOOT_SUFFIX)
CHUNK = 1 << 20


def record_name(image: str) -> str:
    return image + RECORD_SUFFIX


def kernel_name(image: str) -> str:
    return image + KERNEL_SUFFIX


def initrd_name(image: str) -> str:
    return image + INITRD_SUFFIX


def boot_record_name(image: str) -> str:
    return image + BOOT_SUFFIX


def held(volume_names: list[str]) -> dict[str, bool]:
    """The pool's base images (every volume that is not a record, a kernel boot file, a server's disk
    or seed) -> whether a record is beside it. Server disks (``vps-*.qcow2``) and seeds are left out."""
    names = set(volume_names)
    return {
        name: record_name(name) in names
        for name in names
        if not name.endswith(_NOT_IMAGES) and not name.startswith("vps-")
    }


def boot_complete(record: dict[str, Any], image: str, volume_names: list[str]) -> bool:
    """Whether every file a boot record names is in the pool."""
    names = set(volume_names)
    return kernel_name(image) in names and (record.get("initrd") is None or initrd_name(image) in names)


def _volume_xml(name: str, size: int) -> str:
    # raw: the bytes uploaded are the file as it is (a qcow2 image stays qcow2; libvirt reads its format back)
    return (
        f"<volume><name>{name}</name><capacity unit='bytes'>{size}</capacity>"
        "<target><format type='raw'/></target></volume>"
    )


def upload(
    conn: Any,
    pool: Any,
    name: str,
    data: Callable[[int], bytes],
    size: int,
    progress: Callable[[int], None] | None = None,
) -> Any:
    vol = pool.createXML(_volume_xml(name, size), 0)
    sent = 0

    def source(_stream: Any, nbytes: int, _opaque: Any) -> bytes:
        nonlocal sent
        block = data(nbytes)
        sent += len(block)
        if progress is not None:
            progress(sent)
        return block

    try:
        stream = conn.newStream(0)
        vol.upload(stream, 0, size, 0)
        stream.sendAll(source, None)
        stream.finish()
    except BaseException:
        vol.delete(0)  # made here a moment ago: nothing can be using it
        raise
    return vol


def read_volume(conn: Any, vol: Any, sink: Callable[[bytes], None]) -> None:
    """Every byte of ``vol``, through a download stream."""
    size = int(vol.info()[1])
    stream = conn.newStream(0)
    vol.download(stream, 0, size, 0)

    def receive(_stream: Any, block: bytes, _opaque: Any) -> int:
        sink(block)
        return len(block)

    stream.recvAll(receive, None)
    stream.finish()


def read_record(conn: Any, vol: Any) -> str:
    parts: list[bytes] = []
    read_volume(conn, vol, parts.append)
    return b"".join(parts).decode("ascii", "replace").strip()[:200]


def volume_checksum(conn: Any, vol: Any, kind: str) -> str:
    digest = hashlib.new(kind)
    read_volume(conn, vol, digest.update)
    return f"{kind}:{digest.hexdigest()}"


def write_record(conn: Any, pool: Any, image: str, version: str) -> None:
    _write_small(conn, pool, record_name(image), (version + "\n").encode())


def _write_small(conn: Any, pool: Any, name: str, body: bytes) -> None:
    lookup = _lookup(pool, name)
    if lookup is not None:
        lookup.delete(0)
    remaining = [body]

    def data(nbytes: int) -> bytes:
        block, remaining[0] = remaining[0][:nbytes], remaining[0][nbytes:]
        return block

    upload(conn, pool, name, data, len(body))


def read_boot_record(conn: Any, pool: Any, image: str) -> dict[str, Any] | None:
    """The boot record beside ``image`` (``kernel``, ``initrd``: checksums; ``cmdline``; ``format``;
    ``version``), None when there is none or it is not one."""
    vol = _lookup(pool, boot_record_name(image))
    if vol is None:
        return None
    parts: list[bytes] = []
    read_volume(conn, vol, parts.append)
    try:
        record = json.loads(b"".join(parts).decode("utf-8"))
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("kernel"), str):
        return None
    return record


def install_boot(conn: Any, pool: Any, image: str, fmt: str, boot: KernelBootFiles) -> bool:
    """Put ``boot``'s kernel and initrd beside ``image`` in ``pool`` and record them (with the command
    line and the image's format); False when the pool held this very record already.

    A record naming the same files with another command line or format is rewritten; one naming
    other files is refused. Boot files without a record (an upload cut short) are sent again.

    :raises PluginError: the pool holds other boot files for ``image``.
    """
    record = {
        "version": boot.version,
        "kernel": boot.kernel_checksum,
        "initrd": boot.initrd_checksum,
        "cmdline": boot.cmdline,
        "format": fmt,
    }
    pool.refresh(0)
    held = read_boot_record(conn, pool, image)
    names = [str(name) for name in pool.listVolumes()]
    if held is not None and boot_complete(held, image, names):
        if (held.get("kernel"), held.get("initrd")) != (boot.kernel_checksum, boot.initrd_checksum):
            raise PluginError(
                f"the pool already holds other kernel boot files for {image} ({held.get('version')}), not "
                f"{boot.version}: servers of {image} boot from them; give new ones a new image file name in the catalog"
            )
        if held == record:
            return False
        _write_small(conn, pool, boot_record_name(image), json.dumps(record).encode())
        return True
    stale = _lookup(pool, boot_record_name(image))
    if stale is not None:  # files missing under it: sent again, then recorded again
        stale.delete(0)
    files = [(kernel_name(image), boot.kernel)]
    if boot.initrd is not None:
        files.append((initrd_name(image), boot.initrd))
    for name, local in files:
        old = _lookup(pool, name)
        if old is not None:  # unrecorded: left by an upload cut short
            old.delete(0)
        path = Path(local)
        with path.open("rb") as f:
            upload(conn, pool, name, f.read, path.stat().st_size)
    _write_small(conn, pool, boot_record_name(image), json.dumps(record).encode())
    return True


def _lookup(pool: Any, name: str) -> Any | None:
    import libvirt  # only reached with a connection, so the binding is there

    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise


def install(
    conn: Any,
    pool: Any,
    image: str,
    path: Path,
    version: str,
    progress: Callable[[int], None] | None = None,
    boot: KernelBootFiles | None = None,
    fmt: str = "qcow2",
) -> bool:
    """Put ``path`` into ``pool`` as ``image`` and record ``version``; False when the pool held it already.
    With ``boot``, its kernel boot files go there first (:func:`install_boot`).

    :raises PluginError: the pool holds another version, or an unrecorded file that is not this one.
    """
    booted = install_boot(conn, pool, image, fmt, boot) if boot is not None else False
    return _install_image(conn, pool, image, path, version, progress) or booted


def _install_image(
    conn: Any, pool: Any, image: str, path: Path, version: str, progress: Callable[[int], None] | None
) -> bool:
    pool.refresh(0)
    vol = _lookup(pool, image)
    if vol is not None:
        record = _lookup(pool, record_name(image))
        recorded = read_record(conn, record) if record is not None else None
        if recorded == version:
            return False
        if recorded is None and volume_checksum(conn, vol, version.split(":", 1)[0]) == version:
            write_record(conn, pool, image, version)  # put there by hand, and it is this very image
            return True
        raise PluginError(
            f"the pool already holds {image} ({recorded or 'unrecorded, with another checksum'}), not {version}: "
            "servers' disks are overlays on a base image, so it is never replaced; give a new version a new "
            "image file name in the catalog (or delete the volume if no server uses it)"
        )
    size = path.stat().st_size
    with path.open("rb") as f:
        upload(conn, pool, image, f.read, size, progress)
    write_record(conn, pool, image, version)
    return True
