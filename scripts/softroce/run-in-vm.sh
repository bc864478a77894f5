#!/usr/bin/env bash
# Runs SCRIPT inside a small Linux VM with soft-RoCE (the kernel's rdma_rxe): real
# kernel verbs and the real libibverbs rxe provider, on a host with no RDMA hardware and
# no RDMA kernel support. The VM (plain qemu emulation, no KVM needed) boots in seconds,
# mounts this machine's whole filesystem at / over 9p, and has one NIC eth0 =
# 10.0.2.15 with an RDMA device rxe0 on it. SCRIPT runs as root in the caller's working
# directory; its exit status is this command's.
#
#   usage: scripts/softroce/run-in-vm.sh SCRIPT [MEMORY_MIB]
#
# Needs root: the first run installs qemu and the RDMA user-space packages (apt-get)
# and builds a kernel + initramfs cache in $SWARM_SOFTROCE_CACHE
# (default /var/tmp/swarm-softroce). Environment variables are not passed to SCRIPT.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 SCRIPT [MEMORY_MIB]" >&2; exit 2; }
script=$(readlink -f "$1")
memory=${2:-3072}
workdir=$PWD
cache=${SWARM_SOFTROCE_CACHE:-/var/tmp/swarm-softroce}
case "$script$workdir" in *" "*) echo "paths with spaces are not supported" >&2; exit 2 ;; esac

packages="qemu-system-x86 busybox-static cpio kmod rdma-core ibverbs-providers ibverbs-utils iproute2"
missing=$(for p in $packages; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done)
if [ -n "$missing" ]; then
    echo "softroce: installing $(echo $missing)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# Kernel modules the VM loads, in dependency order.
modules="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci 9pnet \
9pnet_virtio netfs fscache 9p failover net_failover virtio_net ib_core ib_uverbs \
udp_tunnel ip6_udp_tunnel crc32_generic rdma_rxe"

if [ ! -f "$cache/initrd.gz" ]; then
    echo "softroce: building the VM image in $cache (once)" >&2
    rm -rf "$cache"
    mkdir -p "$cache/pkg"
    (
        cd "$cache/pkg"
        kernel_pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
        apt-get download "$kernel_pkg" >/dev/null 2>&1
        dpkg-deb -x ./*.deb root
    )
    version=$(ls "$cache/pkg/root/lib/modules")
    /sbin/depmod -b "$cache/pkg/root" "$version"
    cp "$cache/pkg/root/boot/vmlinuz-$version" "$cache/vmlinuz"
    ramfs="$cache/ramfs"
    mkdir -p "$ramfs"/{bin,mod,host,proc,sys,dev}
    cp /usr/bin/busybox "$ramfs/bin/"
    for m in $modules; do
        find "$cache/pkg/root/lib/modules/$version" -name "$m.ko*" -exec cp {} "$ramfs/mod/" \;
    done
    cat >"$ramfs/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $modules; do insmod /mod/\$m.ko* 2>/dev/null || echo "softroce-vm: cannot load \$m"; done
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 host /host
mount --bind /proc /host/proc; mount --bind /sys /host/sys; mount --bind /dev /host/dev
mkdir -p /host/dev/shm; mount -t tmpfs shm /host/dev/shm
ip link set lo up; ip link set eth0 up; ip addr add 10.0.2.15/24 dev eth0
arg() { sed "s/.*\$1=\([^ ]*\).*/\1/" /proc/cmdline; }
chroot /host /bin/sh -c "PATH=/usr/sbin:/usr/bin:/sbin:/bin rdma link add rxe0 type rxe netdev eth0"
chroot /host /bin/bash -c "cd \$(arg swarm_cwd) && PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin bash \$(arg swarm_script)"
echo "softroce-vm: exit \$?"
poweroff -f
INIT
    chmod +x "$ramfs/init"
    (cd "$ramfs" && find . | cpio -o -H newc 2>/dev/null | gzip >"$cache/initrd.gz")
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
qemu-system-x86_64 -m "$memory" -smp 2 -nographic -no-reboot \
    -kernel "$cache/vmlinuz" -initrd "$cache/initrd.gz" \
    -append "console=ttyS0 panic=-1 loglevel=3 swarm_script=$script swarm_cwd=$workdir" \
    -virtfs local,path=/,mount_tag=host,security_model=passthrough,id=host \
    -nic user,model=virtio-net-pci 2>/dev/null | tr -d '\r' | tee "$log" |
    grep -v -E '^\[|SeaBIOS|iPXE|Booting from|Press Ctrl-B|Probing EDD' || true
status=$(sed -n 's/^softroce-vm: exit \([0-9]*\).*/\1/p' "$log" | tail -1)
exit "${status:-1}"
