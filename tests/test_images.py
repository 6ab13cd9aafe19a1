"""Base images: ``vpsshop images sync`` from a local mirror onto two real libvirtd hosts of one location.

The two hosts are private libvirtd instances (tests/libvirt_peer.py ``PrivateLibvirtd``), each with
its own storage pool; the mirror is a local HTTP server serving a small qcow2 image, a checksum file
listing it, and a corrupted copy that the sync must refuse. Nothing boots: the order test only
checks that an order for an OS no host holds is refused before any charge.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.server
import io
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chain_nodes import peer_workdir, remove_workdir
from libvirt_peer import PrivateLibvirtd
from test_dashboard import D, sign_in

from vpsshop.images import ImageError, Progress, fetch, status, sync
from vpsshop.settings import Settings, load_settings
from vpsshop.testing import TEST_ENCRYPTION_KEY, TEST_SECRET_KEY

POOL = "images"


@pytest.fixture(scope="module")
def mirror() -> Iterator[tuple[str, Path]]:
    """An HTTP server over a directory: tiny.qcow2, SHA256SUMS naming it, and broken.qcow2 (tiny's
    bytes with one changed) listed under tiny's checksum in broken.sums."""
    root = peer_workdir("image-mirror")
    image = root / "tiny.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True)
    data = image.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    (root / "SHA256SUMS").write_text(f"{'0' * 64}  other.qcow2\n{digest}  tiny.qcow2\n")
    corrupted = bytearray(data)
    corrupted[len(corrupted) // 2] ^= 0xFF
    (root / "broken.qcow2").write_bytes(bytes(corrupted))

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root
    server.shutdown()
    remove_workdir(root)


@pytest.fixture(scope="module")
def hosts() -> Iterator[list[PrivateLibvirtd]]:
    """Two private libvirtd instances, each with an empty dir pool named ``images``."""
    started = []
    try:
        for index in range(2):
            workdir = peer_workdir(f"images-host{index}")
            daemon = PrivateLibvirtd(workdir)
            started.append(daemon)
            directory = workdir / "pool"
            directory.mkdir()
            shutil.chown(directory, daemon.user.pw_uid, daemon.user.pw_gid)
            xml = workdir / "pool.xml"
            xml.write_text(f"<pool type='dir'><name>{POOL}</name><target><path>{directory}</path></target></pool>")
            created = daemon.virsh("pool-create", str(xml))
            assert created.returncode == 0, created.stderr
        yield started
    finally:
        for daemon in started:
            daemon.close()
            remove_workdir(daemon.dir)


def _pool_dir(daemon: PrivateLibvirtd) -> Path:
    return daemon.dir / "pool"


PLAN_AND_LOCATION = """
[[plans]]
id = "pup"
name = "Pup"
vcpu = 1
memory_mib = 512
disk_gib = 5
bandwidth_tb = 1
base_price_cents = 399

[[locations]]
id = "nl"
name = "Amsterdam"
country = "NL"
price_modifier = "1.00"
"""
"""The test catalogs' one plan and one location (their operating systems follow)."""


def _catalog(tmp_path: Path, url: str, root: Path) -> Path:
    path = tmp_path / "catalog.toml"
    path.write_text(
        PLAN_AND_LOCATION
        + f"""
[[operating_systems]]
id = "tiny"
name = "Tiny"
family = "debian"
image = "tiny.qcow2"
[operating_systems.source]
url = "{url}/tiny.qcow2"
checksum_url = "{url}/SHA256SUMS"

[[operating_systems]]
id = "broken"
name = "Broken"
family = "debian"
image = "broken.qcow2"
[operating_systems.source]
url = "{url}/broken.qcow2"
checksum = "sha256:{hashlib.sha256((root / "tiny.qcow2").read_bytes()).hexdigest()}"

[[operating_systems]]
id = "manual"
name = "Manual"
family = "debian"
image = "manual.qcow2"
"""
    )
    return path


def _settings(tmp_path: Path, catalog: Path, hosts: list[PrivateLibvirtd]) -> Settings:
    return load_settings(
        None,
        environ={},
        overrides={
            "mode": "sandbox",
            "database_url": f"sqlite:///{tmp_path / 'shop.db'}",
            "secret_key": TEST_SECRET_KEY,
            "encryption_key": TEST_ENCRYPTION_KEY,
            "catalog": {"source": "file", "file": {"path": str(catalog)}},
            "hypervisor": {
                "backend": "libvirt",
                "libvirt": {
                    "domain_type": "qemu",
                    "guest_reports": False,
                    "locations": {
                        "nl": {
                            "hosts": [
                                {"uri": h.uri, "name": f"host{i}", "max_memory_mib": 4096} for i, h in enumerate(hosts)
                            ],
                            "pool": POOL,
                            "network": "user",
                            "addresses": "198.51.100.10-198.51.100.20",
                        }
                    },
                },
            },
        },
    )


def test_a_corrupted_download_is_refused_and_deleted(mirror: tuple[str, Path], tmp_path: Path) -> None:
    from vpsshop.catalog import OperatingSystem

    url, root = mirror
    good = "sha256:" + hashlib.sha256((root / "tiny.qcow2").read_bytes()).hexdigest()
    os_ = OperatingSystem.model_validate(
        {
            "id": "broken",
            "name": "B",
            "family": "x",
            "image": "broken.qcow2",
            "source": {"url": f"{url}/broken.qcow2", "checksum": good},
        }
    )
    with pytest.raises(ImageError, match="corrupt"):
        fetch(os_, tmp_path / "cache", io.StringIO())
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == []


def test_the_checksum_file_line_naming_the_image_counts(mirror: tuple[str, Path], tmp_path: Path) -> None:
    from vpsshop.catalog import OperatingSystem

    url, root = mirror
    os_ = OperatingSystem.model_validate(
        {
            "id": "tiny",
            "name": "T",
            "family": "x",
            "image": "tiny.qcow2",
            "source": {"url": f"{url}/tiny.qcow2", "checksum_url": f"{url}/SHA256SUMS"},
        }
    )
    out = io.StringIO()
    path, version = fetch(os_, tmp_path / "cache", out)
    assert version == "sha256:" + hashlib.sha256((root / "tiny.qcow2").read_bytes()).hexdigest()
    assert path.read_bytes() == (root / "tiny.qcow2").read_bytes()
    assert "tiny download" in out.getvalue() and "MiB" in out.getvalue()
    # cached: a second fetch downloads nothing (no progress line)
    again = io.StringIO()
    assert fetch(os_, tmp_path / "cache", again) == (path, version)
    assert again.getvalue() == ""


def test_progress_bar_on_a_terminal_redraws_one_line() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    bar = Progress("x", 4 << 20, out)
    bar.update(2 << 20)
    bar.finish()
    assert out.getvalue().startswith("\rx: [###############               ]  50.0% 2.0/4.0 MiB")
    assert out.getvalue().endswith("\rx: [###############               ]  50.0% 2.0/4.0 MiB\n")


def test_sync_puts_the_image_on_both_hosts_and_refuses_the_corrupted_one(
    mirror: tuple[str, Path], hosts: list[PrivateLibvirtd], tmp_path: Path
) -> None:
    from vpsshop.assembly import build_context

    url, root = mirror
    ctx = build_context(_settings(tmp_path, _catalog(tmp_path, url, root), hosts))
    out = io.StringIO()

    async def run() -> Any:
        try:
            first = await sync(ctx, tmp_path / "cache", out)
            second = await sync(ctx, tmp_path / "cache", out)
            rows = await status(ctx)
            return first, second, rows
        finally:
            await ctx.close()

    first, second, rows = asyncio.run(run())
    by_os = {r.os_id: r for r in first}
    assert by_os["tiny"].hosts == ("host0", "host1") and by_os["tiny"].error is None
    assert by_os["broken"].error is not None and "corrupt" in by_os["broken"].error
    assert by_os["manual"].skipped == "no source"
    assert {r.os_id: r.hosts for r in second if r.error is None and r.skipped is None} == {"tiny": ()}
    for daemon in hosts:
        held = sorted(p.name for p in _pool_dir(daemon).iterdir())
        assert held == ["tiny.qcow2", "tiny.qcow2.vpsshop-version"], held
        assert (_pool_dir(daemon) / "tiny.qcow2").read_bytes() == (root / "tiny.qcow2").read_bytes()
    version = "sha256:" + hashlib.sha256((root / "tiny.qcow2").read_bytes()).hexdigest()
    states = {(r.host, r.os_id): (r.state, r.version) for r in rows}
    assert states[("host0", "tiny")] == ("recorded", version)
    assert states[("host1", "tiny")] == ("recorded", version)
    assert states[("host0", "broken")][0] == "missing" and states[("host1", "manual")][0] == "missing"
    assert "tiny -> nl" in out.getvalue()


def test_an_os_no_host_of_the_location_holds_is_refused_before_any_charge(
    mirror: tuple[str, Path], hosts: list[PrivateLibvirtd], tmp_path: Path
) -> None:
    """After a sync, tiny is on both hosts and manual on neither: an order for manual is a 409
    os_unavailable and charges nothing; one for tiny is taken. Start-up says what is missing."""
    from starlette.testclient import TestClient

    from vpsshop.app import create_app
    from vpsshop.assembly import build_context
    from vpsshop.readiness import component_readiness
    from vpsshop.testing import create_test_account

    url, root = mirror
    settings = _settings(tmp_path, _catalog(tmp_path, url, root), hosts)
    ctx = build_context(settings)
    results = asyncio.run(sync(ctx, tmp_path / "cache", io.StringIO(), only=["tiny"]))
    asyncio.run(ctx.close())
    assert [r.error for r in results] == [None]
    with TestClient(create_app(settings, background=False)) as client:
        shop = client.app.state.ctx
        assert shop.unoffered_systems() == {"nl": ["broken", "manual"]}
        account = create_test_account(client)
        account.credit("10")
        body = {"plan": "pup", "location": "nl", "hostname": "img-test"}
        refused = client.post("/v1/servers", headers=account.headers, json={**body, "os": "manual"})
        assert refused.status_code == 409 and refused.json()["error"] == "os_unavailable", refused.text
        quote = client.post("/v1/servers/quote", headers=account.headers, json={**body, "os": "broken"})
        assert quote.status_code == 409 and quote.json()["error"] == "os_unavailable"
        assert client.get("/v1/account", headers=account.headers).json()["balance_usd"] == 10
        located = client.get("/v1/catalog").json()["locations"]
        assert [(loc["id"], loc["operating_systems"]) for loc in located] == [("nl", ["tiny"])]
        llms = client.get("/llms.txt").text
        assert "Operating systems (every location above): `tiny`." in llms and "`manual`" not in llms
        health = client.get("/v1/health").json()
        assert any("images: nl lacks broken, manual" in c.get("detail", "") for c in health["components"]), health
        hypervisor = [r for item, r in asyncio.run(component_readiness(shop)) if item.component is shop.hypervisor]
        assert hypervisor[0].figures["unoffered_systems_total"] == 2  # /metrics: vpsshop_component_figure
        assert sign_in(client, account.login_token).status_code == 303
        form = client.get(f"{D}/servers/new").text
        assert '<option value="tiny"' in form and '<option value="manual"' not in form
        taken = client.post("/v1/servers", headers=account.headers, json={**body, "os": "tiny"})
        assert taken.status_code == 201, taken.text
        assert client.get("/v1/account", headers=account.headers).json()["balance_usd"] == 6.01


def test_the_command_line_syncs_and_reports_each_host(
    mirror: tuple[str, Path], hosts: list[PrivateLibvirtd], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``vpsshop images sync`` exits 1 (the corrupted image is refused) after putting tiny everywhere;
    ``vpsshop images status`` lists each host and exits 1 while one lacks an image."""
    from vpsshop.cli import main

    url, root = mirror
    catalog = _catalog(tmp_path, url, root)
    config = tmp_path / "vpsshop.toml"
    uris = ", ".join(f'{{ uri = "{h.uri}", name = "host{i}", max_memory_mib = 4096 }}' for i, h in enumerate(hosts))
    config.write_text(
        f"""mode = "sandbox"
database_url = "sqlite:///{tmp_path / "shop.db"}"
secret_key = "{TEST_SECRET_KEY}"
encryption_key = "{TEST_ENCRYPTION_KEY}"
[catalog]
source = "file"
[catalog.file]
path = "{catalog}"
[hypervisor]
backend = "libvirt"
[hypervisor.libvirt]
domain_type = "qemu"
guest_reports = false
[hypervisor.libvirt.locations.nl]
hosts = [{uris}]
pool = "{POOL}"
network = "user"
"""
    )
    assert main(["images", "sync", "--config", str(config), "--cache", str(tmp_path / "cache")]) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith("tiny\tnl\tok\t") for line in out), out
    assert any(line.startswith("broken\t*\tREFUSED\t") and "corrupt" in line for line in out), out
    assert "manual\t*\tskipped\tno source" in out
    assert main(["images", "status", "--config", str(config)]) == 1
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [r[:4] for r in rows if r[2] == "tiny"] == [
        ["nl", "host0", "tiny", "recorded"],
        ["nl", "host1", "tiny", "recorded"],
    ]
    assert [r[:4] for r in rows if r[2] == "manual"] == [
        ["nl", "host0", "manual", "missing"],
        ["nl", "host1", "manual", "missing"],
    ]


def test_an_image_in_another_format_than_the_catalog_says_is_refused(mirror: tuple[str, Path]) -> None:
    """The qcow2 file named raw in the catalog, and a raw source where overlays expect qcow2: no upload."""
    from vpsshop import PluginError
    from vpsshop_libvirt import LibvirtBackend, LibvirtConfig

    _, root = mirror
    location = {"hosts": [{"uri": "qemu+unix:///session?socket=/nonexistent"}], "pool": POOL}
    raw_base = LibvirtBackend(LibvirtConfig.model_validate({"base_image_format": "raw", "locations": {"nl": location}}))
    with pytest.raises(PluginError, match="is a qcow2 file, not the raw image"):
        asyncio.run(raw_base.install_image("nl", "tiny.qcow2", str(root / "tiny.qcow2"), "raw", "sha256:" + "0" * 64))
    qcow2_base = LibvirtBackend(LibvirtConfig.model_validate({"locations": {"nl": location}}))
    with pytest.raises(PluginError, match="disks here are made on a qcow2 base image"):
        asyncio.run(qcow2_base.install_image("nl", "tiny.qcow2", str(root / "tiny.qcow2"), "raw", "sha256:" + "0" * 64))


def test_an_image_source_names_exactly_one_checksum() -> None:
    from pydantic import ValidationError

    from vpsshop import ImageSource

    url = "https://example.test/a.qcow2"
    with pytest.raises(ValidationError, match="exactly one of checksum and checksum_url"):
        ImageSource.model_validate({"url": url})
    with pytest.raises(ValidationError, match="exactly one of checksum and checksum_url"):
        ImageSource.model_validate({"url": url, "checksum": "sha256:" + "a" * 64, "checksum_url": url + ".sums"})
    with pytest.raises(ValidationError, match="checksum"):
        ImageSource.model_validate({"url": url, "checksum": "md5:" + "a" * 32})
    assert ImageSource.model_validate({"url": url, "checksum": "sha512:" + "b" * 128}).format == "qcow2"


def test_checksum_files_in_gnu_and_bsd_layouts() -> None:
    from vpsshop.images import checksum_in_file

    sha = "ab" * 32
    other = "cd" * 32
    gnu = f"{other}  other.qcow2\n{sha.upper()} *debian-12.qcow2\n"
    assert checksum_in_file(gnu, "debian-12.qcow2", "sha256") == sha
    # Fedora's CHECKSUM: BSD lines inside a PGP signature, comments beside them
    bsd = (
        "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n"
        "# Fedora-Cloud-Base-Generic-41-1.4.x86_64.qcow2: 497221632 bytes\n"
        f"SHA256 (Fedora-Cloud-Base-Generic-41-1.4.x86_64.qcow2) = {sha}\n"
        f"SHA256 (Fedora-Cloud-Base-Generic-41-1.4.x86_64.raw.xz) = {other}\n"
        "-----BEGIN PGP SIGNATURE-----\nxyz\n-----END PGP SIGNATURE-----\n"
    )
    assert checksum_in_file(bsd, "Fedora-Cloud-Base-Generic-41-1.4.x86_64.qcow2", "sha256") == sha
    assert checksum_in_file(bsd, "Fedora-Cloud-Base-Generic-41-1.4.x86_64.raw.xz", "sha256") == other
    # a name with ") = " in it is still read from the last separator; other kinds and bad hex do not count
    assert checksum_in_file(f"SHA256 (a) = b.img) = {sha}\n", "a) = b.img", "sha256") == sha
    assert checksum_in_file(bsd, "Fedora-Cloud-Base-Generic-41-1.4.x86_64.qcow2", "sha512") is None
    assert checksum_in_file(f"{'zz' * 32}  x.img\n", "x.img", "sha256") is None
    assert checksum_in_file(gnu, "missing.qcow2", "sha256") is None


# ---- direct kernel boot: the manifest's kernel and initrd ---------------------------------------

KERNEL_CMDLINE = "root=/dev/vda rw console=ttyS0 quiet"


def _sha256(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def boot_mirror(mirror: tuple[str, Path]) -> tuple[str, Path]:
    """Beside the mirror's images: kboot.raw and kbad.raw (bare raw images), a kernel and an initrd
    for them (not bootable: nothing boots here), and vmlinuz-kbad, the kernel with one byte changed."""
    url, root = mirror
    (root / "kboot.raw").write_bytes(b"kboot-root-fs".ljust(1 << 20, b"\0"))
    (root / "kbad.raw").write_bytes(b"kbad-root-fs".ljust(1 << 20, b"\0"))
    kernel = bytes(range(256)) * 1200 + b"vmlinuz"
    (root / "vmlinuz-kboot").write_bytes(kernel)
    (root / "boot").mkdir()
    (root / "boot" / "initrd-kboot.img").write_bytes(bytes(reversed(range(256))) * 700)
    corrupted = bytearray(kernel)
    corrupted[1000] ^= 0xFF
    (root / "vmlinuz-kbad").write_bytes(bytes(corrupted))
    return url, root


def _kernel_catalog(tmp_path: Path, url: str, root: Path) -> Path:
    """kboot: a raw image booted with a kernel beside it (a path relative to the image's url) and
    an initrd (an absolute URL); kbad: its kernel's download does not match its checksum."""
    path = tmp_path / "catalog.toml"
    path.write_text(
        PLAN_AND_LOCATION
        + f"""
[[operating_systems]]
id = "kboot"
name = "Kernel boot"
family = "debian"
image = "kboot.raw"
[operating_systems.source]
url = "{url}/kboot.raw"
checksum = "{_sha256(root / "kboot.raw")}"
format = "raw"
[operating_systems.source.kernel_boot]
kernel = {{ url = "vmlinuz-kboot", checksum = "{_sha256(root / "vmlinuz-kboot")}" }}
initrd = {{ url = "{url}/boot/initrd-kboot.img", checksum = "{_sha256(root / "boot" / "initrd-kboot.img")}" }}
cmdline = "{KERNEL_CMDLINE}"

[[operating_systems]]
id = "kbad"
name = "Corrupted kernel"
family = "debian"
image = "kbad.raw"
[operating_systems.source]
url = "{url}/kbad.raw"
checksum = "{_sha256(root / "kbad.raw")}"
format = "raw"
[operating_systems.source.kernel_boot]
kernel = {{ url = "vmlinuz-kbad", checksum = "{_sha256(root / "vmlinuz-kboot")}" }}
"""
    )
    return path


def test_sync_puts_kernel_and_initrd_beside_the_image_on_both_hosts_and_refuses_a_corrupted_kernel(
    boot_mirror: tuple[str, Path], hosts: list[PrivateLibvirtd], tmp_path: Path
) -> None:
    """kboot's image, kernel and initrd reach both pools (the image counts as current there); kbad,
    whose kernel is corrupted, is refused and nothing of it reaches a host. A host that loses the
    initrd counts the image as missing until the next sync puts it back, there alone."""
    from vpsshop.assembly import build_context

    url, root = boot_mirror
    ctx = build_context(_settings(tmp_path, _kernel_catalog(tmp_path, url, root), hosts))
    out = io.StringIO()

    async def run() -> Any:
        try:
            first = await sync(ctx, tmp_path / "cache", out)
            again = await sync(ctx, tmp_path / "cache", out)
            rows = await status(ctx)
            deleted = hosts[1].virsh("vol-delete", "--pool", POOL, "kboot.raw.vpsshop-initrd")
            assert deleted.returncode == 0, deleted.stderr
            lacking = await status(ctx)
            repaired = await sync(ctx, tmp_path / "cache", out, only=["kboot"])
            return first, again, rows, lacking, repaired, await status(ctx)
        finally:
            await ctx.close()

    first, again, rows, lacking, repaired, after = asyncio.run(run())
    by_os = {r.os_id: r for r in first}
    assert by_os["kboot"].hosts == ("host0", "host1") and by_os["kboot"].error is None
    assert by_os["kbad"].error is not None and "corrupt" in by_os["kbad"].error
    assert "vmlinuz-kbad" in by_os["kbad"].error
    assert {r.os_id: (r.hosts, r.error) for r in again} == {"kboot": ((), None), "kbad": ((), by_os["kbad"].error)}
    assert "kboot kernel download" in out.getvalue() and "kboot initrd download" in out.getvalue()
    for daemon in hosts:
        pool = _pool_dir(daemon)
        assert not any(p.name.startswith("kbad") for p in pool.iterdir())
        assert (pool / "kboot.raw").read_bytes() == (root / "kboot.raw").read_bytes()
        assert (pool / "kboot.raw.vpsshop-kernel").read_bytes() == (root / "vmlinuz-kboot").read_bytes()
        assert (pool / "kboot.raw.vpsshop-initrd").read_bytes() == (root / "boot" / "initrd-kboot.img").read_bytes()
        assert (pool / "kboot.raw.vpsshop-version").read_text().strip() == _sha256(root / "kboot.raw")
    image = _sha256(root / "kboot.raw")
    assert {(r.host, r.state, r.version) for r in rows if r.os_id == "kboot"} == {
        ("host0", "current", image),
        ("host1", "current", image),
    }
    assert {(r.host, r.state) for r in rows if r.os_id == "kbad"} == {("host0", "missing"), ("host1", "missing")}
    assert {(r.host, r.state) for r in lacking if r.os_id == "kboot"} == {("host0", "current"), ("host1", "missing")}
    assert [(r.os_id, r.hosts, r.error) for r in repaired] == [("kboot", ("host1",), None)]
    assert {(r.host, r.state) for r in after if r.os_id == "kboot"} == {("host0", "current"), ("host1", "current")}


def test_the_domain_of_a_kernel_boot_image_boots_the_pool_volumes(
    boot_mirror: tuple[str, Path], hosts: list[PrivateLibvirtd], tmp_path: Path
) -> None:
    """The domain the plugin defines on a host for kboot loads the kernel and initrd volumes of that
    host's pool with the manifest's command line, on a qcow2 overlay of the raw image; moved to the
    other host, it names that host's volumes; a ``kernel_boot`` setting for the image wins."""
    import xml.etree.ElementTree as ET

    from vpsshop.assembly import build_context
    from vpsshop.servers.contract import contract_spec
    from vpsshop_libvirt import KernelBoot, LibvirtBackend, _move_boot_files, domain_xml

    url, root = boot_mirror
    settings = _settings(tmp_path, _kernel_catalog(tmp_path, url, root), hosts)
    ctx = build_context(settings)
    results = asyncio.run(sync(ctx, tmp_path / "cache", io.StringIO(), only=["kboot"]))
    asyncio.run(ctx.close())
    assert [r.error for r in results] == [None]
    backend = build_context(settings).hypervisor
    assert isinstance(backend, LibvirtBackend)
    loc = backend.location("nl")
    spec = contract_spec("nl", os_image="kboot.raw")
    conn = backend._conn(hosts[0].uri)
    pool, pool_path = backend._pool(conn, loc)
    boot = backend._boot(conn, pool, "kboot.raw")
    assert boot is not None and boot.format == "raw"
    disk = backend._disk(pool, pool_path, spec, boot)
    dom = conn.defineXML(domain_xml(spec, backend.cfg, loc, disk.path(), f"{pool_path}/{spec.name}-seed.iso", boot))
    try:
        desc = ET.fromstring(dom.XMLDesc(0))
        held = _pool_dir(hosts[0])
        assert desc.findtext("os/kernel") == str(held / "kboot.raw.vpsshop-kernel")
        assert desc.findtext("os/initrd") == str(held / "kboot.raw.vpsshop-initrd")
        assert desc.findtext("os/cmdline") == KERNEL_CMDLINE
        backing = ET.fromstring(disk.XMLDesc(0)).find("backingStore")
        assert backing is not None and backing.findtext("path") == str(held / "kboot.raw")
        assert backing.find("format").get("type") == "raw"  # type: ignore[union-attr]
        other = str(_pool_dir(hosts[1]))
        _move_boot_files(desc, pool_path, other)
        assert desc.findtext("os/kernel") == f"{other}/kboot.raw.vpsshop-kernel"
        assert desc.findtext("os/initrd") == f"{other}/kboot.raw.vpsshop-initrd"
    finally:
        dom.undefine()
        disk.delete(0)
        asyncio.run(backend.close())
    overridden = {"kernel": "/srv/boot/vmlinuz", "cmdline": "root=/dev/vda ro", "format": "raw"}
    configured = settings.model_copy(deep=True)
    configured.hypervisor["libvirt"]["kernel_boot"] = {"kboot.raw": overridden}
    backend = build_context(configured).hypervisor
    assert isinstance(backend, LibvirtBackend)
    try:
        conn = backend._conn(hosts[0].uri)
        pool, _ = backend._pool(conn, backend.location("nl"))
        assert backend._boot(conn, pool, "kboot.raw") == KernelBoot.model_validate(overridden)
    finally:
        asyncio.run(backend.close())


def test_a_backend_without_kernel_boot_gets_no_kernel_boot_image(
    boot_mirror: tuple[str, Path], hosts: list[PrivateLibvirtd], tmp_path: Path
) -> None:
    from vpsshop.assembly import build_context

    url, root = boot_mirror
    ctx = build_context(_settings(tmp_path, _kernel_catalog(tmp_path, url, root), hosts))
    assert ctx.hypervisor is not None
    ctx.hypervisor.capabilities = ctx.hypervisor.capabilities - {"kernel_boot"}
    try:
        (result,) = asyncio.run(sync(ctx, tmp_path / "cache", io.StringIO(), only=["kboot"]))
    finally:
        asyncio.run(ctx.close())
    assert result.error == "the hypervisor backend (libvirt) cannot take an image's kernel boot files"


def test_a_kernel_boot_manifest_is_validated() -> None:
    from pydantic import ValidationError

    from vpsshop.catalog import BootFile, ImageSource

    image = {"url": "https://example.test/os/a.raw", "checksum": "sha256:" + "a" * 64, "format": "raw"}
    kernel = {"url": "vmlinuz", "checksum": "sha512:" + "b" * 128}
    source = ImageSource.model_validate({**image, "kernel_boot": {"kernel": kernel}})
    assert source.kernel_boot is not None and source.kernel_boot.initrd is None
    assert source.kernel_boot.cmdline == "root=/dev/vda rw console=ttyS0"
    assert source.boot_file_url(source.kernel_boot.kernel) == "https://example.test/os/vmlinuz"
    up = BootFile.model_validate({**kernel, "url": "../boot/vmlinuz"})
    assert source.boot_file_url(up) == "https://example.test/boot/vmlinuz"
    assert source.boot_file_url(BootFile.model_validate({**kernel, "url": "file:///srv/k"})) == "file:///srv/k"
    for bad, message in [
        ({"kernel": {"url": "vmlinuz"}}, "checksum"),
        ({"kernel": {**kernel, "checksum": "md5:" + "a" * 32}}, "checksum"),
        ({"kernel": {**kernel, "url": "/boot/vmlinuz"}}, "relative to the image"),
        (
            {"kernel": kernel, "initrd": {"url": "ftp://x/initrd", "checksum": kernel["checksum"]}},
            "https://, http:// or file://",
        ),
        ({"kernel": kernel, "append": "quiet"}, "append"),
        ({"kernel": kernel, "cmdline": "root=/dev/vda\nquiet"}, "cmdline"),
        ({"initrd": kernel}, "kernel"),
    ]:
        with pytest.raises(ValidationError, match=message):
            ImageSource.model_validate({**image, "kernel_boot": bad})


def test_kernel_boot_files_and_records_are_not_base_images() -> None:
    from vpsshop_libvirt import images

    names = [
        "kboot.raw",
        "kboot.raw.vpsshop-version",
        "kboot.raw.vpsshop-kernel",
        "kboot.raw.vpsshop-initrd",
        "kboot.raw.vpsshop-boot",
        "vps-1.qcow2",
    ]
    assert images.held(names) == {"kboot.raw": True}
    assert images.boot_complete({"kernel": "sha256:x", "initrd": "sha256:y"}, "kboot.raw", names)
    assert not images.boot_complete({"kernel": "sha256:x", "initrd": "sha256:y"}, "kboot.raw", names[:3])
    assert images.boot_complete({"kernel": "sha256:x", "initrd": None}, "kboot.raw", names[:3])
