"""The machine's libvirtd (QEMU under TCG), as every test that boots or defines real domains needs it.

``system_libvirtd()`` makes sure ``qemu:///system`` answers and has finished probing QEMU, starting
``virtlogd -d`` and ``libvirtd -d`` (Debian packages in ``scripts/deps/apt-servers.txt``) when none
runs. It returns the PIDs it started so the caller can stop them.

Two things about this machine make a freshly started libvirtd slow, and both are handled here
rather than by generous timeouts in each test:

- Where /dev/kvm is root-only (containers; Debian's udev rule would give it to group ``kvm``),
  libvirt finds KVM unusable for the ``libvirt-qemu`` user and throws away its cached QEMU
  capabilities on every domain definition: each define then re-probes QEMU, half a minute or more
  under TCG on a loaded machine. The device is given to group ``kvm``, mode 660, before libvirtd
  starts.
- libvirtd answers only once its QEMU driver has probed the emulator, which on a busy 2-core
  machine has taken longer than 10 s. The wait is long, and it ends with the domain capabilities
  read once, so the first test does not pay for the probe inside its own deadline.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

URI = "qemu:///system"
ANSWER_SECONDS = 180


def _virsh(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["virsh", "-c", URI, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(["virsh"], 124, "", f"virsh {' '.join(args)}: no answer in {timeout} s")


def answers() -> bool:
    return _virsh("version", timeout=30).returncode == 0


def kvm_device_for_group_kvm() -> None:
    kvm = Path("/dev/kvm")
    if kvm.exists() and os.geteuid() == 0 and shutil.which("chgrp"):
        subprocess.run(["chgrp", "kvm", str(kvm)], check=False, capture_output=True)
        kvm.chmod(0o660)


def _running(daemon: str) -> list[int]:
    found = subprocess.run(["pgrep", "-x", daemon], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found]


def _wait_until_it_answers(seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not answers():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _start(daemon: str) -> int | None:
    pidfile = Path(f"/run/{daemon}.pid")
    subprocess.run([shutil.which(daemon) or f"/usr/sbin/{daemon}", "-d"], check=True)
    for _ in range(100):
        if pidfile.is_file() and pidfile.read_text().strip():
            return int(pidfile.read_text().strip())
        time.sleep(0.1)
    return None


def system_libvirtd() -> list[int]:
    """Make ``qemu:///system`` answer with QEMU probed; the PIDs of the daemons started here.

    A libvirtd that runs but does not answer within a minute (left wedged by an earlier run: the
    machine's services stay as the last session left them) is stopped and started again."""
    import signal

    kvm_device_for_group_kvm()
    started: list[int] = []
    healthy = answers() or (bool(_running("libvirtd")) and _wait_until_it_answers(60))
    if not healthy:
        for pid in _running("libvirtd"):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _running("libvirtd") and time.monotonic() < deadline:
            time.sleep(0.1)
        for daemon in ("virtlogd", "libvirtd"):
            if not _running(daemon):
                pid = _start(daemon)
                if pid is not None:
                    started.append(pid)
        if not _wait_until_it_answers(ANSWER_SECONDS):
            running = subprocess.run(["pgrep", "-a", "libvirtd"], capture_output=True, text=True).stdout
            raise RuntimeError(
                f"libvirtd did not answer on {URI} within {ANSWER_SECONDS} s "
                f"(running: {running.strip() or 'none'}; last: {_virsh('version').stderr.strip()})"
            )
    # The QEMU probe, paid once here: later defines reuse the cached capabilities.
    probe = _virsh("domcapabilities", "--virttype", "qemu", "--arch", "x86_64", timeout=ANSWER_SECONDS)
    if probe.returncode != 0:
        raise RuntimeError(f"libvirtd on {URI} could not describe QEMU/TCG: {probe.stderr.strip()}")
    return started


def stop(pids: list[int]) -> None:
    """Stop the daemons ``system_libvirtd`` started (newest first)."""
    import signal

    for pid in reversed(pids):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


LIBVIRT_SOCKET = "/var/run/libvirt/libvirt-sock"


class LibvirtdRelay:
    """A Unix-socket relay in front of the system libvirtd that a test can cut, freeze and restore.

    Freezing it is a host that stops answering without closing anything (lost power or network),
    which a libvirtd that restarts never is; a test that must restart libvirtd for real uses
    :class:`PrivateLibvirtd`. vpsshop reaches the relay as ``qemu+unix:///system?socket=<relay>``.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.uri = f"qemu+unix:///system?socket={path}"
        self.pairs: list[Any] = []
        self.frozen = False
        self.lock = threading.Lock()
        self.listener: Any = None
        self.restore()

    def restore(self) -> None:
        import socket

        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(64)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _accept(self, listener: Any) -> None:
        import socket

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(LIBVIRT_SOCKET)
            with self.lock:
                self.pairs += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: Any, sink: Any) -> None:
        import socket

        try:
            while data := source.recv(65536):
                if not self.frozen:  # frozen: a black hole, as a host that lost power or its network
                    sink.sendall(data)
        except OSError:
            pass
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def freeze(self) -> None:
        """Keep every connection open but pass nothing either way from now on."""
        self.frozen = True

    def cut(self) -> None:
        import socket

        self.listener.close()
        self.path.unlink()
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for s in pairs:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


class PrivateLibvirtd:
    """A libvirtd of one test alone, which the test may stop and start again for real.

    The system libvirtd serves every session's tests on this machine at once (defining, booting and
    destroying their domains), so no test may restart it: a restart would fail whatever another
    session's test is doing at that moment, and nothing tells a test that it is alone. This is the
    same ``/usr/sbin/libvirtd`` run in session mode as an unprivileged user (``nobody``), with its
    socket, configuration, state, logs and capability cache in ``directory``: its QEMU driver,
    storage pools and domains are its own, and its domains' QEMU processes keep running while it is
    stopped (libvirtd finds them again when it starts, as the system daemon does after a restart).
    vpsshop (as root) reaches it as ``qemu+unix:///session?socket=<directory>/run/libvirt/libvirt-sock``.
    """

    def __init__(self, directory: Path, user: str = "nobody") -> None:
        import pwd

        self.dir = directory
        self.user = pwd.getpwnam(user)
        for sub in ("run", "config", "cache", "data"):
            (directory / sub).mkdir(parents=True, exist_ok=True)
        for path in (directory, *directory.rglob("*")):
            os.chown(path, self.user.pw_uid, self.user.pw_gid)
        directory.chmod(0o755)
        self.env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(directory),
            "XDG_RUNTIME_DIR": str(directory / "run"),
            "XDG_CONFIG_HOME": str(directory / "config"),
            "XDG_CACHE_HOME": str(directory / "cache"),
            "XDG_DATA_HOME": str(directory / "data"),
        }
        self.socket = directory / "run" / "libvirt" / "libvirt-sock"
        self.uri = f"qemu+unix:///session?socket={self.socket}"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()
        # The QEMU probe, paid once here (the capability cache is in ``directory``).
        probe = self.virsh("domcapabilities", "--virttype", "qemu", "--arch", "x86_64", timeout=ANSWER_SECONDS)
        if probe.returncode != 0:
            raise RuntimeError(f"private libvirtd could not describe QEMU/TCG: {probe.stderr.strip()}")

    def virsh(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(["virsh", "-c", self.uri, *args], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(["virsh"], 124, "", f"virsh {' '.join(args)}: no answer in {timeout} s")

    def answers(self) -> bool:
        return self.virsh("version", timeout=30).returncode == 0

    def start(self) -> None:
        """Start libvirtd and wait until it answers."""
        log = open(self.dir / "libvirtd.log", "ab")  # noqa: SIM115 - the daemon writes it until it exits
        self.process = subprocess.Popen(
            ["/usr/sbin/libvirtd", "--timeout", "0"],
            env=self.env,
            cwd=self.dir,
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            extra_groups=[],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + ANSWER_SECONDS
        while not self.answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"private libvirtd did not answer: {(self.dir / 'libvirtd.log').read_text()[-2000:]}"
                )
            time.sleep(0.3)

    def stop(self) -> None:
        """Stop libvirtd as its service manager would (SIGTERM, then wait); its domains keep running."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(60)
        self.process = None

    def pids(self) -> list[int]:
        """Every process this daemon left behind (libvirtd, QEMU, virtlogd): those whose environment
        names ``directory`` as their home."""
        mark = f"HOME={self.dir}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if mark in (proc / "environ").read_bytes().split(b"\0"):
                        found.append(int(proc.name))
                except OSError:
                    continue
        return found

    def close(self) -> None:
        """Destroy its domains, stop it, end every process it started; the directory stays for the caller."""
        import signal

        if self.process is None:
            self.start()
        for name in self.virsh("list", "--name").stdout.split():
            self.virsh("destroy", name)
        self.stop()
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class NamespacedLibvirtd:
    """A second privileged libvirtd on this machine, in a mount namespace of its own.

    A host with bridged guests needs what only a privileged libvirtd has: the nwfilter driver (the
    shop's anti-spoofing filter is always on for a bridged location; session mode refuses it with
    "Can't define NWFilters in session mode") and tap devices on a Linux bridge. The same
    ``/usr/sbin/libvirtd`` runs as root in a mount namespace where the directories of its state
    (:attr:`PRIVATE`) are bind mounts of directories under ``directory``, so its socket,
    configuration, domains, capability cache and logs are its own, while it shares this machine's
    network namespace (its guests join the same bridges as the system daemon's) and file systems
    (its pools are ordinary directories). QEMU's output goes to files (``stdio_handler = "file"``):
    the system daemon's virtlogd stays the system daemon's. vpsshop reaches it as
    ``qemu+unix:///system?socket=<directory>/run/libvirt-sock``.
    """

    PRIVATE: ClassVar[dict[str, str]] = {
        "run": "/run/libvirt",
        "etc": "/etc/libvirt",
        "qemu": "/var/lib/libvirt/qemu",
        "cache": "/var/cache/libvirt",
        "log": "/var/log/libvirt",
    }

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        for sub, target in self.PRIVATE.items():
            Path(target).mkdir(parents=True, exist_ok=True)
            source = directory / sub
            if sub in ("etc", "cache"):  # its configuration, and the QEMU probe the system daemon cached
                shutil.copytree(target, source, symlinks=True)
            else:
                source.mkdir(parents=True)
            mode = Path(target).stat()
            os.chown(source, mode.st_uid, mode.st_gid)
            source.chmod(mode.st_mode & 0o7777)
        with (directory / "etc" / "qemu.conf").open("a") as conf:
            conf.write('\nstdio_handler = "file"\n')
        self.socket = directory / "run" / "libvirt-sock"
        self.uri = f"qemu+unix:///system?socket={self.socket}"
        self.process: subprocess.Popen[bytes] | None = None
        self.namespace = ""
        self.start()
        probe = self.virsh("domcapabilities", "--virttype", "qemu", "--arch", "x86_64", timeout=ANSWER_SECONDS)
        if probe.returncode != 0:
            raise RuntimeError(f"namespaced libvirtd could not describe QEMU/TCG: {probe.stderr.strip()}")

    def virsh(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(["virsh", "-c", self.uri, *args], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(["virsh"], 124, "", f"virsh {' '.join(args)}: no answer in {timeout} s")

    def start(self) -> None:
        """Start libvirtd in a new mount namespace with its private directories and wait until it answers."""
        import shlex

        mounts = " && ".join(
            f"mount --bind {shlex.quote(str(self.dir / sub))} {target}" for sub, target in self.PRIVATE.items()
        )
        pidfile = shlex.quote(str(self.dir / "libvirtd.pid"))  # not /run/libvirtd.pid: the system daemon's
        log = open(self.dir / "libvirtd.log", "ab")  # noqa: SIM115 - the daemon writes it until it exits
        self.process = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f"{mounts} && exec /usr/sbin/libvirtd --pid-file {pidfile} --timeout 0",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + ANSWER_SECONDS
        while self.virsh("version", timeout=30).returncode != 0:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"namespaced libvirtd did not answer: {(self.dir / 'libvirtd.log').read_text()[-2000:]}"
                )
            time.sleep(0.3)
        self.namespace = os.readlink(f"/proc/{self.process.pid}/ns/mnt")

    def pids(self) -> list[int]:
        """Every process in its mount namespace (libvirtd and its domains' QEMU)."""
        found = []
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    if os.readlink(proc / "ns" / "mnt") == self.namespace:
                        found.append(int(proc.name))
                except OSError:
                    continue
        return found

    def close(self) -> None:
        """Destroy its domains, stop it and every process of its namespace; the directory stays for the caller."""
        import signal

        for name in self.virsh("list", "--name").stdout.split():
            self.virsh("destroy", name)
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process = None


GUEST_IMAGE = "debian-12-test.raw"
"""The file name the test guest's disk image has in a pool (the catalog's debian-12 points at it)."""


@contextmanager
def guest_image_pool(
    uri: str, guest: Path, tag: str = "vpsshop-guest", pool_name: str | None = None
) -> Iterator[tuple[str, Path]]:
    """A transient dir pool holding the guest image of ``scripts/build-test-guest.sh`` (``guest``, its
    cache directory) as :data:`GUEST_IMAGE`, with its kernel and initrd, readable by libvirt-qemu:
    (pool name, directory); ``pool_name`` names the pool (the hosts of one location share a pool
    name). Afterwards every domain whose disks lie in it is destroyed too, so a test or bench that
    failed half-way leaves no guest running."""
    import libvirt

    images = Path("/var/lib/libvirt/images")
    images.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=images))
    conn = libvirt.open(uri)
    pool = None
    try:
        directory.chmod(0o755)
        subprocess.run(["cp", "--sparse=always", str(guest / "rootfs.raw"), str(directory / GUEST_IMAGE)], check=True)
        for name in ("vmlinuz", "initrd.img"):
            shutil.copy(guest / name, directory / name)
        name = pool_name or f"{tag}-{uuid.uuid4().hex[:8]}"
        pool = conn.storagePoolCreateXML(
            f"<pool type='dir'><name>{name}</name><target><path>{directory}</path></target></pool>", 0
        )
        yield name, directory
    finally:
        for dom in conn.listAllDomains():
            if f"{directory}/" in dom.XMLDesc():
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
        if pool is not None:
            pool.destroy()
        conn.close()
        shutil.rmtree(directory, ignore_errors=True)


def ipv6_prefix(prefix: str) -> str:
    """The IPv6 /64 :func:`isolated_network` gives the network whose IPv4 /24 is ``prefix``, without
    its length: "10.213.7" -> "fd42:213:7::" (the bridge holds ``::1``)."""
    second, third = prefix.split(".")[1:3]
    return f"fd42:{second}:{third}::"


@contextmanager
def isolated_network(uri: str, first: str = "10.213", tag: str = "vpsshop-guest") -> Iterator[tuple[str, str]]:
    """A transient isolated network without DHCP or DNS whose bridge holds the gateway ``<prefix>.1``
    and ``<ipv6_prefix(prefix)>1/64``, so this host reaches its guests directly over both: (libvirt
    network name, /24 prefix such as "10.213.7")."""
    import libvirt

    # libvirt records each guest's MAC in a file here, even for a network without dnsmasq, and
    # only the dnsmasq-base package would make the directory.
    Path("/var/lib/libvirt/dnsmasq").mkdir(parents=True, exist_ok=True)
    used = {
        line.split()[3].rsplit(".", 1)[0]
        for line in subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout.splitlines()
    }
    prefix = next(p for p in (f"{first}.{random.randrange(1, 250)}" for _ in range(100)) if p not in used)
    short = uuid.uuid4().hex[:6]
    conn = libvirt.open(uri)
    net = conn.networkCreateXML(
        f"<network><name>{tag}-{short}</name><bridge name='vpsg{short}' stp='off'/><dns enable='no'/>"
        f"<ip address='{prefix}.1' netmask='255.255.255.0'/>"
        f"<ip family='ipv6' address='{ipv6_prefix(prefix)}1' prefix='64'/></network>"
    )
    try:
        yield f"{tag}-{short}", prefix
    finally:
        net.destroy()
        conn.close()


def host_can_shape() -> bool:
    """Whether this host's kernel has what libvirt's interface <bandwidth> runs (``tc`` with the
    htb and sfq qdiscs and the police action). Debian's kernels do; the 2-core CI VM's kernel
    (no modules) has no sfq, so libvirt refuses every cap there and the measured rate is not
    checked on it (docs/operations.md, "Traffic": what a host needs to throttle)."""
    name = f"vpsprobe{os.getpid() % 10000}"
    if subprocess.run(["ip", "link", "add", name, "type", "dummy"], capture_output=True).returncode:
        return False
    try:
        return subprocess.run(["tc", "qdisc", "add", "dev", name, "root", "sfq"], capture_output=True).returncode == 0
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True)
