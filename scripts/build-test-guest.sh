#!/usr/bin/env bash
# Builds the Debian 12 guest that the slow real-guest test boots (tests/test_real_guest.py), once.
#
#   ./scripts/build-test-guest.sh            # prints the cache directory holding the image
#
# No cloud image can be downloaded on the test machines, but Debian's archive can be reached, so
# the guest is made from packages: debootstrap (minbase + systemd, cloud-init, OpenSSH and the
# cloud kernel), then `mkfs.ext4 -d` turns the root directory into a raw disk image with the file
# system directly on the disk (no partition table: the guest's root is /dev/vda). The kernel and
# initrd are copied out next to it for libvirt's direct kernel boot, so no boot loader is needed.
#
# The result is cached outside the repository in $VPSSHOP_TEST_GUEST_CACHE (default
# /var/cache/vpsshop-test-guest/<hash of this script>/): a changed script builds a new image, an
# unchanged one returns at once. The directory holds:
#   rootfs.raw  the disk image (ext4, 2 GiB sparse)
#   vmlinuz     the guest's kernel
#   initrd.img  its initramfs
#   cmdline     the kernel command line to boot it with
# Needs root, debootstrap and e2fsprogs (scripts/deps/apt-servers.txt).
set -euo pipefail

SCRIPT=$(readlink -f "$0")
HASH=$(sha256sum "$SCRIPT" | cut -c1-16)
CACHE_ROOT=${VPSSHOP_TEST_GUEST_CACHE:-/var/cache/vpsshop-test-guest}
OUT="$CACHE_ROOT/$HASH"
MIRROR=${VPSSHOP_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# locales, with en_US.UTF-8 generated below as on Debian's cloud images: cloud-init sets that locale on
# first boot (update-locale); without it cloud-config.service fails and `cloud-init status` is error.
PACKAGES=systemd-sysv,cloud-init,openssh-server,linux-image-cloud-amd64,ifupdown,netbase,python3-cffi-backend,udev,locales

if [ -f "$OUT/done" ]; then
    echo "$OUT"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "build-test-guest.sh: needs root (debootstrap)" >&2
    exit 1
fi
mkdir -p "$CACHE_ROOT"
exec 9>"$CACHE_ROOT/.lock"
flock 9  # one build at a time; a second caller waits and then finds the result
if [ -f "$OUT/done" ]; then
    echo "$OUT"
    exit 0
fi

WORK=$(mktemp -d "$CACHE_ROOT/.build-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ROOT="$WORK/root"

echo "==> debootstrap bookworm into $ROOT" >&2
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$ROOT" "$MIRROR" >&2

echo "==> configuring the guest" >&2
echo "/dev/vda / ext4 errors=remount-ro 0 1" >"$ROOT/etc/fstab"
# Only the NoCloud seed ISO: without this cloud-init probes network metadata services for minutes.
cat >"$ROOT/etc/cloud/cloud.cfg.d/90-vpsshop-test-guest.cfg" <<'EOF'
datasource_list: [NoCloud, None]
EOF
sed -i 's/^# *en_US.UTF-8 UTF-8/en_US.UTF-8 UTF-8/' "$ROOT/etc/locale.gen"
chroot "$ROOT" locale-gen >&2
# A new machine id on first boot, and host keys made by cloud-init for each instance.
: >"$ROOT/etc/machine-id"
rm -f "$ROOT"/etc/ssh/ssh_host_*
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/*

echo "==> extracting kernel and initrd" >&2
mkdir -p "$WORK/out"
cp "$(ls "$ROOT"/boot/vmlinuz-* | sort -V | tail -1)" "$WORK/out/vmlinuz"
cp "$(ls "$ROOT"/boot/initrd.img-* | sort -V | tail -1)" "$WORK/out/initrd.img"
chmod 0644 "$WORK/out/vmlinuz" "$WORK/out/initrd.img"
echo "root=/dev/vda rw console=ttyS0 net.ifnames=0" >"$WORK/out/cmdline"

echo "==> mkfs.ext4 -d" >&2
mkfs.ext4 -q -L rootfs -d "$ROOT" "$WORK/out/rootfs.raw" 2G >&2
chmod 0644 "$WORK/out/rootfs.raw"

rm -rf "$OUT"
mv "$WORK/out" "$OUT"
touch "$OUT/done"
echo "$OUT"
