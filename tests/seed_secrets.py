"""Where a server's root password could be left in clear on a hypervisor host, and whether a hash in
a seed image really is the password's.

The libvirt backend writes only the password's sha512-crypt hash into the NoCloud seed. The tests
read the seed back as the guest does (``isoinfo``), check the hash with the system's own crypt(3)
(libxcrypt, the library a guest's PAM checks logins with, not the library that made the hash), and
search every file of the pool, of the domain and of its attached devices for the password's bytes.
"""

from __future__ import annotations

import email
import json
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

CHUNK = 8 * 1024 * 1024


def isoinfo(iso: Path, *args: str) -> str:
    return subprocess.run(["isoinfo", "-i", str(iso), *args], capture_output=True, text=True, check=True).stdout


def iso_files(iso: Path) -> dict[str, bytes]:
    """Every file of an ISO 9660 image by its Rock Ridge path, read back with isoinfo."""
    listing = isoinfo(iso, "-R", "-f").split()
    files = {}
    for path in listing:
        data = subprocess.run(["isoinfo", "-i", str(iso), "-R", "-x", path], capture_output=True, check=True).stdout
        files[path] = data
    return files


def seed_root_hash(iso: Path) -> str:
    """The ``password`` of root's ``chpasswd`` entry in the seed's user-data, asserting ``type: hash``."""
    user_data = isoinfo(iso, "-R", "-x", "/user-data")
    if user_data.startswith("Content-Type: multipart/"):  # the customer's user data is a script
        parts = email.message_from_string(user_data).get_payload()
        assert isinstance(parts, list)
        [config] = [part for part in parts if part.get_content_type() == "text/cloud-config"]
        user_data = config.get_payload(decode=True).decode()
    assert user_data.startswith("#cloud-config\n"), user_data[:200]
    [entry] = json.loads(user_data.split("\n", 1)[1])["chpasswd"]["users"]
    assert entry["name"] == "root" and entry["type"] == "hash", entry
    return str(entry["password"])


def crypt_verifies(password: str, hashed: str) -> bool:
    """True when the system's crypt(3) turns ``password`` into ``hashed``.

    Perl's ``crypt`` is libc's (libxcrypt on Debian; perl-base is essential there). The password goes
    through standard input, never a command line another process could read."""
    script = 'local $/; my $p = <STDIN>; print crypt($p, $ARGV[0]) eq $ARGV[0] ? "yes" : "no"'
    out = subprocess.run(["perl", "-e", script, hashed], input=password, capture_output=True, text=True, check=True)
    return out.stdout == "yes"


def files_holding(needle: bytes, paths: Iterable[Path]) -> list[str]:
    """Which files of ``paths`` (directories searched through) contain ``needle``, each named once in
    sorted order; every byte of every file is read, in chunks that overlap by the needle's length."""
    files = set()
    for top in paths:
        files |= {top} if top.is_file() else {p for p in top.rglob("*") if p.is_file()}
    found = []
    for path in sorted(files):
        tail = b""
        with path.open("rb") as fh:
            while chunk := fh.read(CHUNK):
                if needle in tail + chunk:
                    found.append(str(path))
                    break
                tail = chunk[-len(needle) :]
    return found


def attached_files(domain_xml: str) -> list[Path]:
    """The host files behind every disk and cdrom of a domain, with their backing chains, and its
    kernel and initrd (direct kernel boot)."""
    root = ET.fromstring(domain_xml)
    paths = [Path(s.get("file", "")) for s in root.iter("source") if s.get("file")]
    paths += [Path(e.text) for tag in ("kernel", "initrd") for e in root.iter(tag) if e.text]
    return paths


LIBVIRT_DIRS = ("/etc/libvirt/qemu", "/run/libvirt/qemu", "/var/log/libvirt/qemu", "/var/lib/libvirt/qemu")


def domain_host_files(name: str) -> list[Path]:
    """What the local libvirtd keeps for domain ``name``: its definition, live state and pid file, its
    QEMU log, its private directory (``domain-<id>-<name>``, the master key)."""
    found: list[Path] = []
    for top in map(Path, LIBVIRT_DIRS):
        if top.is_dir():
            found += sorted(p for p in top.rglob(f"*{name}*") if p.is_file() or p.is_dir())
    return found
