# Shared by the scripts that run braid in a QEMU guest booting Debian's own
# kernel under software emulation (tools/rdma-guest-tests.sh,
# tools/ptrace-guest.sh): what a test needs from a kernel that is not the
# host's. Sourced, not run.

# guest_kernel DIR [MODULE...]: Debian's default kernel in DIR/vmlinuz and
# the named modules (paths under the kernel's tree, without .ko) in
# DIR/modules, fetched once with apt-get download.
guest_kernel() {
  local dir=$1 module missing=0
  shift
  mkdir -p "$dir/modules"
  [ -f "$dir/vmlinuz" ] || missing=1
  for module in "$@"; do
    ls "$dir/modules/$(basename "$module")".ko* >/dev/null 2>&1 || missing=1
  done
  [ $missing -eq 0 ] && return 0
  local package
  package=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
  [ -n "$package" ] || { echo "guest: apt knows no linux-image-amd64" >&2; return 1; }
  (cd "$dir" && apt-get download -o APT::Sandbox::User=root "$package" >/dev/null && rm -rf kernel &&
    dpkg-deb -x "$package"_*.deb kernel && rm -f "$package"_*.deb) || return 1
  cp "$dir"/kernel/boot/vmlinuz-* "$dir/vmlinuz"
  for module in "$@"; do
    cp "$dir"/kernel/lib/modules/*/kernel/"$module".ko* "$dir/modules/"
  done
  rm -rf "$dir/kernel"
}

# guest_libraries ROOT FILE...: every library the files load, copied into
# ROOT at its own path, where the guest's loader looks for it.
guest_libraries() {
  local root=$1 library
  shift
  for library in $(for file in "$@"; do ldd "$file" | grep -o '/[^ ]*'; done | sort -u); do
    mkdir -p "$root$(dirname "$library")"
    cp -L "$library" "$root$library"
  done
}

# guest_initrd ROOT OUT: ROOT packed as the guest's initramfs.
guest_initrd() {
  (cd "$1" && find . | /bin/busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$2"
}

# guest_console LOG: the guest's console without the firmware's lines and
# the terminal's escape sequences.
guest_console() {
  sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g; s/\x1bc//g; s/\r//g' "$1" |
    grep -a -v -E '^\s*$|SeaBIOS|iPXE|Press Ctrl|Booting from|reboot: Power down'
}
