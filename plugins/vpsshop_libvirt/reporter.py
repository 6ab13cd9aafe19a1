"""The guest's side of readiness: runs inside a new server, once, after its first boot.

The libvirt backend puts this file in the guest through the NoCloud seed (cloud-init's
``write_files``, as ``/usr/local/lib/vpsshop/report-boot``) with a systemd unit ordered after
cloud-init's last stage (``cloud-final.service``) and after the SSH daemon, started by the seed's
``runcmd``. It speaks only over the domain's virtio-serial channel ``org.vpsshop.guest.0`` (the
guest sees ``/dev/virtio-ports/org.vpsshop.guest.0``), never over the network: the host writes
``report`` and the guest answers one line of JSON::

    {"vpsshop_guest": 1, "ssh": true, "host_keys": ["ssh-ed25519 AAAA...", ...], "errors": []}

On the instance's first boot the seed also holds the SSH daemon back (a runtime drop-in, written by
``bootcmd``, makes ``ssh.service`` wait for :data:`RELEASED`), so nobody logs in to a half-configured
server. This program releases it once cloud-init has finished, starts the daemon if the system
wants it (the customer's user data may have turned it off), waits for its banner, and only then
reports: the shop makes the server ``active`` at the moment SSH first answers. ``host_keys`` are the
public keys the daemon serves (``/etc/ssh/ssh_host_*_key.pub``); ``errors`` are cloud-init's
(``/run/cloud-init/result.json``).
The host answers ``ok`` once it has the report, and the program exits; until then it answers every
``report`` again (a worker that restarted asks again), for at most a day.

Python 3 standard library only (every cloud-init guest has Python 3); it must also run on the
oldest Python 3 a catalog image ships (3.9, AlmaLinux 9 and Rocky Linux 9), so no newer syntax than
that; annotations are never evaluated.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

PORT = "/dev/virtio-ports/org.vpsshop.guest.0"
RELEASED = "/run/vpsshop/first-boot-done"
SSH_UNITS = ("ssh.service", "sshd.service")
SERVE_SECONDS = 86400
SSH_WAIT_SECONDS = 120
RESULT = "/run/cloud-init/result.json"


def systemctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *list(args)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def release_ssh() -> bool:
    """Let the SSH daemon start (the seed held it back during the first boot) and start it, unless
    the system has it turned off; True when it is meant to run."""
    os.makedirs(os.path.dirname(RELEASED), exist_ok=True)
    with open(RELEASED, "w"):
        pass
    wanted = False
    for unit in SSH_UNITS:
        state = systemctl("is-enabled", unit).stdout.strip()
        if state in ("enabled", "enabled-runtime", "static", "alias", "indirect"):
            wanted = True
            systemctl("start", unit)
            break
    if not wanted and systemctl("is-enabled", "ssh.socket").stdout.strip() == "enabled":
        wanted = True
    return wanted


def banner(port: int = 22) -> bool:
    """Whether an SSH daemon answers on this machine with its banner."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.settimeout(3)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def disk_host_keys() -> list[str]:
    """The public host keys the SSH daemon serves (its default ``HostKey`` files)."""
    keys: list[str] = []
    directory = "/etc/ssh"
    for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
        if name.startswith("ssh_host_") and name.endswith(".pub"):
            with open(os.path.join(directory, name)) as fh:
                parts = fh.read().split()
            if len(parts) >= 2:
                keys.append(parts[0] + " " + parts[1])
    return keys


def boot_errors() -> list[str]:
    """cloud-init's errors of this boot (empty when it finished cleanly)."""
    try:
        with open(RESULT) as fh:
            result = json.load(fh)
    except (OSError, ValueError):
        return ["cloud-init left no result (" + RESULT + "): it did not finish"]
    errors = result.get("v1", {}).get("errors", [])
    return [str(e)[:300] for e in errors][:10]


def report() -> dict[str, Any]:
    errors, keys = boot_errors(), disk_host_keys()  # read first: the shop activates the server at the banner
    wanted = release_ssh()
    deadline = time.monotonic() + SSH_WAIT_SECONDS
    ssh = banner()
    while not ssh and wanted and time.monotonic() < deadline:
        time.sleep(0.05)
        ssh = banner()
    return {"vpsshop_guest": 1, "ssh": ssh, "host_keys": keys or disk_host_keys(), "errors": errors}


def serve(port: int, answer: Callable[[], dict[str, Any]], serve_seconds: float = SERVE_SECONDS) -> bool:
    """Answer each ``report`` line read from the file descriptor ``port`` with ``answer()`` (made
    once, on the first request) until the host says ``ok``; True when it did."""
    line = b""
    made = None
    end = time.monotonic() + serve_seconds
    while time.monotonic() < end:
        ready, _, _ = select.select([port], [], [], 5.0)
        if not ready:
            continue
        data = os.read(port, 4096)
        if not data:
            time.sleep(0.5)  # the host side is not connected
            continue
        line += data
        while b"\n" in line:
            request, line = line.split(b"\n", 1)
            request = request.strip()
            if request == b"ok":
                return True
            if request == b"report":
                if made is None:
                    made = (json.dumps(answer(), separators=(",", ":")) + "\n").encode()
                os.write(port, made)
        line = line[-64:]
    return False


def main() -> int:
    if not os.path.exists(PORT):
        print("vpsshop: no channel " + PORT + ": nothing to report to", file=sys.stderr)
        return 0
    port = os.open(PORT, os.O_RDWR)
    try:
        return 0 if serve(port, report) else 1
    finally:
        os.close(port)


if __name__ == "__main__":
    sys.exit(main())
