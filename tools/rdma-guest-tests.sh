#!/usr/bin/env bash
# Runs braid's RDMA tests on real verbs: Soft-RoCE (rdma_rxe) inside a
# QEMU guest that boots Debian's own kernel under software emulation, so
# it needs neither RDMA hardware nor RDMA in the host's kernel.
#   One guest, one rxe device on a veth pair:
#   - unit_rdma_stream with IBV_DEV=rxe0 (both ends of every connection
#     on the device): the suite that also runs on the verbs model;
#   - the collectives matrix on 2 ranks with BRAID_TRANSPORT=ib.
#   Two guests, each an rxe device on a virtio NIC, joined by a virtual
#   wire (QEMU's socket network on 127.0.0.1), so RoCE v2 crosses between
#   two kernels: one rank in each, bootstrapped from the launcher
#   variables across the wire, with nothing forced; the perf binaries of
#   AllReduce, AllGather, Broadcast, ReduceScatter, AllToAll and
#   Send/Recv check every result (-c 1); AllReduce and Send/Recv run again
#   with declared buffers (-R 1, braidCommRegister), whose messages of
#   64 KiB and more cross as RDMA reads (each rank logs what it read).
#
#   tools/rdma-guest-tests.sh [BUILD_DIR]     # default: build
#
# Needs a build with the verbs headers (libibverbs-dev), and qemu-system-x86,
# busybox-static, ibverbs-utils and rdma-core (installed here when missing
# and run as root). Downloads the linux-image package once into
# $RDMA_GUEST_DIR (default /tmp/braid-rdma-vm). Takes about a minute.
# Prints the guest's output and exits with the suite's status.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/guest-common.sh
build=${1:-build}
suite="$build/tests/unit/unit_rdma_stream"
collectives="$build/tests/multiproc/collectives_test"
topo="$build/tools/braid-topo"
perf=()
for p in all_reduce all_gather broadcast reduce_scatter alltoall sendrecv; do
  perf+=("$build/perf/${p}_perf")
done
for b in "$suite" "$collectives" "$topo" "${perf[@]}"; do
  [ -x "$b" ] || { echo "no $b: build braid first (ninja -C $build)" >&2; exit 2; }
done

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v ibv_devices >/dev/null || need+=(ibverbs-utils)
command -v rdma >/dev/null || need+=(iproute2)
ls /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so >/dev/null 2>&1 || need+=(rdma-core)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    # 77: meson's "skipped", with the reason.
    echo "SKIP: missing packages ${need[*]} (apt-get install them, or run as root)" >&2
    exit 77
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

work=${RDMA_GUEST_DIR:-/tmp/braid-rdma-vm}
mkdir -p "$work"
# The kernel and the modules Soft-RoCE needs, from the package Debian
# installs by default (fetched once).
guest_kernel "$work" crypto/crc32_generic net/ipv4/udp_tunnel net/ipv6/ip6_udp_tunnel \
  drivers/infiniband/core/ib_core drivers/infiniband/core/ib_uverbs \
  drivers/infiniband/sw/rxe/rdma_rxe drivers/net/veth drivers/virtio/virtio_ring \
  drivers/virtio/virtio drivers/virtio/virtio_pci_modern_dev \
  drivers/virtio/virtio_pci_legacy_dev drivers/virtio/virtio_pci net/core/failover \
  drivers/net/net_failover drivers/net/virtio_net

# A throw-away root: busybox, the suite, iproute2's rdma and ip, the rxe
# provider, and every library they load.
root="$work/root"
rm -rf "$root"
mkdir -p "$root"/{bin,xbin,proc,sys,dev,tmp,etc/libibverbs.d,modules}
cp /bin/busybox "$root/bin/"
cp "$work"/modules/* "$root/modules/"
binaries=("$(readlink -f "$(command -v ip)")" "$(command -v rdma)" "$suite" "$collectives" "$topo"
  "${perf[@]}")
for b in "${binaries[@]}"; do cp "$b" "$root/xbin/"; done
provider=(/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so)
mkdir -p "$root/usr/lib/x86_64-linux-gnu/libibverbs"
cp "${provider[@]}" "$root/usr/lib/x86_64-linux-gnu/libibverbs/"
cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
# libibverbs itself is opened with dlopen by the suite: ldd does not list it.
verbs=/usr/lib/x86_64-linux-gnu/libibverbs.so.1
guest_libraries "$root" "${binaries[@]}" "${provider[@]}" "$verbs"
cp -L "$verbs" "$root$verbs"

# The test binaries find libbraid through their build tree's run path,
# which the guest has not: it gets a directory of its own.
mkdir -p "$root/braidlib"
cp -L "$build/src/libbraid.so.0" "$root/braidlib/"

cat > "$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev; mount -t tmpfs tmp /tmp
export PATH=/xbin:/bin LD_LIBRARY_PATH=/braidlib
# In this order: rdma_rxe needs crc32_generic, or 'rdma link add' fails with ENOENT.
for m in crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe veth virtio_ring \
  virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci failover net_failover virtio_net; do
  insmod /modules/$m.ko 2>/dev/null
done
ip link set lo up
mkdir -p /dev/shm
# The port turns ACTIVE and its GIDs appear a moment after the link is added.
waitport() {
  i=0
  while ! rdma link show rxe0/1 | grep -q 'state ACTIVE' && [ $i -lt 50 ]; do sleep 0.2; i=$((i+1)); done
  sleep 1
  rdma link show rxe0/1
}
# Fixed cost-model figures: the link probe at init would time hundreds
# of messages, which take milliseconds each under emulation.
export BRAID_LINK_ALPHA_US=20 BRAID_LINK_GBPS=1 BRAID_REDUCE_GBPS=2
role=$(sed -n 's/.* role=\([a-z]*\).*/\1/p' /proc/cmdline)
if [ "$role" = single ]; then
  # busybox's own ip cannot make a veth pair: iproute2's, by path.
  /xbin/ip link add veth0 type veth peer name veth1
  /xbin/ip addr add 169.254.77.1/24 dev veth0
  /xbin/ip link set veth0 up; /xbin/ip link set veth1 up
  rdma link add rxe0 type rxe netdev veth0
  waitport
  IBV_DEV=rxe0 /xbin/unit_rdma_stream
  echo "RDMA-SUITE-EXIT $?"
  BRAID_TRANSPORT=ib BRAID_DEBUG=INFO /xbin/collectives_test \
    --gtest_filter='WorldSize/Collectives.Matrix/n2' > /tmp/collectives.log 2>&1
  rc=$?
  grep -E 'RDMA|transports:|OK|FAIL|rror' /tmp/collectives.log
  echo "RDMA-COLLECTIVES-EXIT $rc"
  # braid-topo must see the port active, and must not take QEMU's VGA for a GPU.
  braid-topo --standalone > /tmp/topo.log 2>&1
  rc=$?
  cat /tmp/topo.log
  grep -q '^rdma (this process): rxe0 port 1 active' /tmp/topo.log || rc=1
  grep -q '^ *gpu ' /tmp/topo.log && rc=1
  echo "RDMA-TOPO-EXIT $rc"
else
  rank=0; address=169.254.77.1
  [ "$role" = second ] && rank=1 && address=169.254.77.2
  /xbin/ip addr add $address/24 dev eth0; /xbin/ip link set eth0 up
  rdma link add rxe0 type rxe netdev eth0
  waitport
  export BRAID_RANK=$rank BRAID_WORLD_SIZE=2 BRAID_ADDR=169.254.77.1:29500 BRAID_SOCKET_IFNAME=eth0
  export BRAID_SECRET=$(sed -n 's/.* secret=\([0-9a-f]*\).*/\1/p' /proc/cmdline) BRAID_TIMEOUT=120
  rc=0
  for p in all_reduce_perf all_gather_perf broadcast_perf reduce_scatter_perf alltoall_perf \
    sendrecv_perf; do
    BRAID_DEBUG=INFO /xbin/$p -b 8 -e 512K -f 256 -c 1 -n 2 -w 1 > /tmp/$p.log 2>&1 || rc=1
    grep -E 'RDMA|transports:|float|wrong|Out of bounds|rror' /tmp/$p.log
  done
  # Declared buffers (braidCommRegister): messages of 64 KiB and more are
  # RDMA reads of the sender's buffer, straight into the receiver's.
  for p in all_reduce_perf sendrecv_perf; do
    BRAID_DEBUG=INFO /xbin/$p -R 1 -b 256K -e 2M -f 8 -c 1 -n 2 -w 1 > /tmp/$p-R.log 2>&1 || rc=1
    echo "$p -R 1:"; grep -E 'float|Out of bounds|rror|RDMA reads' /tmp/$p-R.log
    grep -q 'RDMA reads' /tmp/$p-R.log || { echo "$p -R 1: no RDMA read"; rc=1; }
  done
  echo "RDMA-PAIR-$rank-EXIT $rc"
fi
poweroff -f
INIT
chmod +x "$root/init"
guest_initrd "$root" "$work/initrd.gz"

clean() { guest_console "$1"; }
qemu=(timeout 600 qemu-system-x86_64 -accel tcg -m 768 -smp 1 -nographic -no-reboot
  -kernel "$work/vmlinuz" -initrd "$work/initrd.gz")

echo "## one guest, 2 ranks on rxe0"
"${qemu[@]}" -nic none -append "console=ttyS0 panic=-1 quiet role=single" \
  > "$work/single.log" 2>&1 || true
clean "$work/single.log"

runPair() {
  secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "${qemu[@]}" -netdev socket,id=n0,listen=127.0.0.1:$port \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:01 \
    -append "console=ttyS0 panic=-1 quiet role=first secret=$secret" > "$work/first.log" 2>&1 &
  first=$!
  sleep 1
  "${qemu[@]}" -netdev socket,id=n0,connect=127.0.0.1:$port \
    -device virtio-net-pci,netdev=n0,mac=52:54:00:00:00:02 \
    -append "console=ttyS0 panic=-1 quiet role=second secret=$secret" > "$work/second.log" 2>&1 || true
  wait $first || true
  echo "# rank 0's guest"; clean "$work/first.log"
  echo "# rank 1's guest"; clean "$work/second.log"
}
echo "## two guests joined by a virtual wire, a rank in each"
runPair
# The wire is QEMU's socket network between two emulated machines; on a
# loaded host it can stall below the guests' kernels, which then report
# their NIC's transmit queue as timed out (seen once in a CI run, where
# every RDMA call waited for the wire). That says nothing of braid, so the
# pair runs once more, and the second run's verdict stands.
if grep -q 'NETDEV WATCHDOG' "$work/first.log" "$work/second.log"; then
  echo "rdma-guest-tests: the virtual wire stalled (a guest's NIC watchdog fired); running the pair again" >&2
  echo "## two guests joined by a virtual wire, a rank in each (again: the wire stalled)"
  runPair
fi

status=0
check() {  # log, marker
  code=$(sed -n "s/.*$2-EXIT \([0-9]*\).*/\1/p" "$1" | tail -1)
  if [ -z "$code" ]; then
    echo "rdma-guest-tests: $2 did not finish (see $1)" >&2
    status=1
  elif [ "$code" != 0 ]; then
    echo "rdma-guest-tests: $2 failed (exit $code)" >&2
    status=1
  fi
}
check "$work/single.log" RDMA-SUITE
check "$work/single.log" RDMA-COLLECTIVES
check "$work/single.log" RDMA-TOPO
check "$work/first.log" RDMA-PAIR-0
check "$work/second.log" RDMA-PAIR-1
[ $status -eq 0 ] && echo "rdma-guest-tests: all passed"
exit $status
