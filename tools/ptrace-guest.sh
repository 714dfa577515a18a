#!/usr/bin/env bash
# Runs a program in a QEMU guest whose kernel enforces Yama's ptrace_scope,
# as an unprivileged user, and exits with the program's status.
#
# Whether ranks may read each other's memory (single copy) depends on the
# kernel's ptrace rules, which a test cannot set on the machine it runs on:
# Yama is a build option (some kernels lack it), its scope a host-wide
# setting, and root passes its checks. The guest boots Debian's own kernel
# (Yama built in) under software emulation with an initramfs that holds
# busybox, the program and the libraries it loads, sets the scope, and runs
# the program as uid 1000, in the directory this script was started from
# (relative paths hold), with /dev/shm mounted and loopback up. Executables
# keep their absolute paths; --also copies more (programs the first one
# starts). The BRAID_* variables of the caller's environment reach the program.
# With --expect, the run fails unless some line of the program's output
# matches each REGEX (grep -E).
#
#   tools/ptrace-guest.sh [--scope N] [--kernel VMLINUZ] [--timeout S] [--also EXE]... \
#       [--expect REGEX]... -- PROGRAM [ARGS...]
#   BRAID_DEBUG=INFO tools/ptrace-guest.sh --also build/perf/all_reduce_perf -- \
#       build/tools/braidrun -n 2 build/perf/all_reduce_perf -b 1M -e 1M
#
# Needs qemu-system-x86 and busybox-static (installed here when missing and
# run as root; otherwise exits 77, meson's "skipped", saying so). Fetches
# linux-image-amd64's kernel once into $PTRACE_GUEST_DIR (default
# /tmp/braid-ptrace-vm). Takes about ten seconds.
set -euo pipefail
. "$(dirname "$0")/guest-common.sh"

scope=1
kernel=""
timeout_s=300
also=()
expect=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --scope) scope="$2"; shift 2 ;;
    --kernel) kernel="$2"; shift 2 ;;
    --timeout) timeout_s="$2"; shift 2 ;;
    --also) also+=("$(readlink -f "$2")"); shift 2 ;;
    --expect) expect+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "ptrace-guest: unknown argument $1 (usage: see the head of $0)" >&2; exit 2 ;;
  esac
done
[[ $# -ge 1 ]] || { echo "ptrace-guest: no program given" >&2; exit 2; }
program=$(readlink -f "$1")
shift
for executable in "$program" "${also[@]}"; do
  [[ -x "$executable" ]] || { echo "ptrace-guest: $executable is not an executable" >&2; exit 2; }
done

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[[ -x /bin/busybox ]] || need+=(busybox-static)
if [[ ${#need[@]} -gt 0 ]]; then
  if [[ "$(id -u)" -ne 0 ]]; then
    echo "SKIP: missing packages ${need[*]} (apt-get install them, or run as root)" >&2
    exit 77
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

work=${PTRACE_GUEST_DIR:-/tmp/braid-ptrace-vm}
mkdir -p "$work"
if [[ -z "$kernel" ]]; then
  guest_kernel "$work"
  kernel="$work/vmlinuz"
fi

# Each run gets a root of its own, so that runs may overlap.
run=$(mktemp -d "$work/run.XXXXXX")
trap 'rm -rf "$run"' EXIT
root="$run/root"
mkdir -p "$root"/{bin,proc,sys,dev,tmp,etc} "$root$PWD"
cp /bin/busybox "$root/bin/"
for executable in "$program" "${also[@]}"; do
  mkdir -p "$root$(dirname "$executable")"
  cp "$executable" "$root$executable"
done
guest_libraries "$root" "$program" "${also[@]}"
echo 'root:x:0:0:root:/tmp:/bin/sh' > "$root/etc/passwd"
echo 'rank:x:1000:1000:rank:/tmp:/bin/sh' >> "$root/etc/passwd"
printf 'root:x:0:\nrank:x:1000:\n' > "$root/etc/group"

exports=""
for name in $(compgen -e | grep '^BRAID_' || true); do
  exports+="export $name=$(printf '%q' "${!name}")"$'\n'
done
command=$(printf '%q' "$program")
for argument in "$@"; do command+=" $(printf '%q' "$argument")"; done
cat > "$root/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin TERM=dumb
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/shm
mount -t tmpfs -o mode=1777 shm /dev/shm
# Not a tmpfs over /tmp: the programs may live under it (a build in /tmp),
# and the initramfs is writable already.
chmod 1777 /tmp
ip link set lo up
if [ ! -f /proc/sys/kernel/yama/ptrace_scope ]; then
  echo "ptrace-guest: this kernel has no Yama"; echo "PTRACE-GUEST-EXIT 3"; poweroff -f
fi
echo $scope > /proc/sys/kernel/yama/ptrace_scope
$exports
echo "ptrace-guest: kernel \$(uname -r), kernel.yama.ptrace_scope \$(cat /proc/sys/kernel/yama/ptrace_scope), uid 1000"
su rank -s /bin/sh -c "cd $(printf '%q' "$PWD") && exec $command"
echo "PTRACE-GUEST-EXIT \$?"
poweroff -f
EOF
chmod +x "$root/init"
guest_initrd "$root" "$run/initrd.gz"

log="$run/console.log"
timeout "$timeout_s" qemu-system-x86_64 -accel tcg -m 2048 -smp 2 -nographic -no-reboot \
  -nic none -kernel "$kernel" -initrd "$run/initrd.gz" \
  -append "console=ttyS0 quiet panic=-1" </dev/null >"$log" 2>&1 || true
guest_console "$log" | sed -n '/ptrace-guest: /,$p' | grep -v '^PTRACE-GUEST-EXIT' || true
status=$(guest_console "$log" | sed -n 's/^PTRACE-GUEST-EXIT \([0-9]*\)$/\1/p' | tail -1)
if [[ -z "$status" ]]; then
  echo "ptrace-guest: the guest gave no exit status within ${timeout_s} s; its console:" >&2
  guest_console "$log" | tail -30 >&2
  exit 1
fi
echo "ptrace-guest: exit $status"
for pattern in "${expect[@]}"; do
  if ! guest_console "$log" | grep -q -E -- "$pattern"; then
    echo "ptrace-guest: no line of the output matches '$pattern'" >&2
    [[ "$status" -ne 0 ]] || status=1
  fi
done
exit "$status"
