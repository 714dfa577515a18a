#!/usr/bin/env bash
# Builds braid three more times and tests each build:
#   asan: AddressSanitizer with UndefinedBehaviorSanitizer, the suite but for the
#         matrices of perf drivers and trainer runs (below);
#   tsan: ThreadSanitizer, the suite but for the single-threaded simulated network and
#         the matrices of algorithms, perf drivers and trainer runs (below);
#   fuzz: clang's libFuzzer targets (tests/fuzz), the "fuzz" suite.
#
#   tools/test-sanitized.sh            # all three, in build-asan/, build-tsan/, build-fuzz/
#   tools/test-sanitized.sh asan fuzz  # some of them
#
# The guest tests (suites rdma and guest) run in the plain build only: they
# boot a virtual machine, where a sanitized suite would only run slower.
# Every sanitizer stops a process at its first report (meson test sets
# ASan's and UBSan's options, the build's test setup ThreadSanitizer's),
# which fails its test. The sanitized builds run several times slower,
# hence the longer timeouts.
set -euo pipefail
cd "$(dirname "$0")/.."

declare -A sanitize=([asan]=address,undefined [tsan]=thread [fuzz]=fuzzer)
builds=("$@")
[ ${#builds[@]} -eq 0 ] && builds=(asan tsan fuzz)

status=0
for name in "${builds[@]}"; do
  if [ -z "${sanitize[$name]:-}" ]; then
    echo "test-sanitized.sh: unknown build '$name' (asan, tsan or fuzz)" >&2
    exit 2
  fi
  dir=build-$name
  if [ "$name" = fuzz ]; then
    # The fuzz targets bring their own sanitizer flags (docs/RELIABILITY.md).
    # No CUDA: nvcc compiles host code with g++, not the clang of this build.
    [ -d "$dir" ] || CC=clang CXX=clang++ meson setup "$dir" -Dfuzzers=enabled -Dtests=false \
      -Dperf=false -Dcuda=disabled
    ninja -C "$dir"
    meson test -C "$dir" --suite fuzz --print-errorlogs || status=1
    continue
  fi
  # Not the PyTorch backend: it loads into an unsanitized Python, where a
  # sanitizer runtime cannot come first; it reaches braid only through the
  # C ABI, which the sanitized C and C++ tests cover.
  # Not CUDA either: Meson would pass the sanitizer flags to nvcc's host
  # compiler too, and ASan's shadow memory collides with the CUDA driver's
  # mappings; the device kernels' tests run in the plain build (docs/GPU.md).
  # -O1 with line tables only: the sanitizers' advice for readable reports,
  # and much quicker to build than -O2 with full debug information.
  # Nor the perf drivers, whose suite the sanitized runs leave out (below).
  [ -d "$dir" ] || meson setup "$dir" -Db_sanitize="${sanitize[$name]}" -Db_lundef=false \
    -Doptimization=1 -Ddebug=false -Dc_args=-g1 -Dcpp_args=-g1 -Dcuda=disabled -Dtorch=disabled \
    -Dperf=false
  ninja -C "$dir"
  # What the suite relies on (ThreadSanitizer's halt_on_error, fixed
  # cost-model figures in place of the link probe) comes from the build's
  # default test setup (tests/sanitizers/meson.build), so a plain
  # `meson test` in the build directory runs alike.
  skip=(--no-suite rdma --no-suite guest)
  # The simulated network runs every rank in one thread: ThreadSanitizer
  # has nothing to check there, and it was a quarter of the tsan run.
  [ "$name" = tsan ] && skip+=(--no-suite simulation)
  # Nor the forced-algorithm matrix, the perf drivers' output checks and
  # the trainer's matrix of rank counts and optimizers: they run one at a
  # time and were half of the tsan run, and they exercise the same
  # threads as the multiproc suite (one engine for every schedule; the
  # trainer's smoke, resume and three equivalence tests stay). Plain runs
  # them all; ASan runs the forced-algorithm matrix (each schedule executed
  # on real buffers) but not the matrices of the perf drivers and the
  # trainer: tools rather than libbraid, which the plain build checks.
  [ "$name" = tsan ] && skip+=(--no-suite algorithms)
  skip+=(--no-suite perf --no-suite trainer_matrix)
  meson test -C "$dir" --timeout-multiplier 4 --print-errorlogs "${skip[@]}" || status=1
done
exit $status
