"""Base images in a host's storage pool, written and read through libvirt's storage streams (no SSH).

Each base image ``<image>`` a sync put there has a record beside it: a small volume
``<image>.vpsshop-version`` holding the checksum it was verified against (``sha256:<hex>``). The pool
is the truth: the record is written only after the image's upload has finished, so a host holding
an image without its record got it some other way (by hand, or an upload cut short and not
cleaned up), and a sync checks such a file by reading it back before it records it.

A base image that is there is never replaced: the disks of the servers made from it are qcow2
overlays on it, which a new version under the same name would corrupt. A new version takes a new
image file name in the catalog.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vpsshop import PluginError

RECORD_SUFFIX = ".vpsshop-version"
CHUNK = 1 << 20


def record_name(image: str) -> str:
    return image + RECORD_SUFFIX


def held(volume_names: list[str]) -> dict[str, bool]:
    """The pool's base images (every volume that is not a record, a server's disk or seed) -> whether
    a record is beside it. Server disks (``vps-*.qcow2``) and seeds are left out."""
    names = set(volume_names)
    return {
        name: record_name(name) in names
        for name in names
        if not name.endswith(RECORD_SUFFIX) and not name.startswith("vps-")
    }


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
    lookup = _lookup(pool, record_name(image))
    if lookup is not None:
        lookup.delete(0)
    body = (version + "\n").encode()
    remaining = [body]

    def data(nbytes: int) -> bytes:
        block, remaining[0] = remaining[0][:nbytes], remaining[0][nbytes:]
        return block

    upload(conn, pool, record_name(image), data, len(body))


def _lookup(pool: Any, name: str) -> Any | None:
    import libvirt  # only reached with a connection, so the binding is there

    try:
        return pool.storageVolLookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_STORAGE_VOL:
            return None
        raise


def install(
    conn: Any, pool: Any, image: str, path: Path, version: str, progress: Callable[[int], None] | None = None
) -> bool:
    """Put ``path`` into ``pool`` as ``image`` and record ``version``; False when the pool held it already.

    :raises PluginError: the pool holds another version, or an unrecorded file that is not this one.
    """
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
