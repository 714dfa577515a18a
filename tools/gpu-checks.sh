#!/usr/bin/env bash
# The checks of braid's CUDA build that need a GPU, in one run of a few
# minutes, for a GPU machine that may lack the build's dependencies.
#
#   tools/gpu-checks.sh bundle DIR      (on the build machine, after a CUDA
#       build in ./build) copies the CUDA tests, the perf binaries, braidrun,
#       libbraid and the shared libraries they need (not glibc) into DIR;
#   tools/gpu-checks.sh run DIR OUT     (on the GPU machine) runs, each under
#       a time limit, and logs to OUT/gpu-checks.log:
#       1. the kernels against the host reference (cuda_device_reduce);
#       2. every collective among 2, 3 and 4 processes on GPU 0, on stream
#          NULL and on a CUDA stream, each way of exporting memory
#          (cuda_gpu_collectives);
#       3. compute-sanitizer memcheck and racecheck on the kernels and on
#          AllReduce, AllGather and ReduceScatter among 2 processes;
#       4. the GPU's copy bandwidth and AllReduce among 2 processes on the
#          one GPU (8 B to 256 MiB) over cuda_ipc, then with
#          BRAID_CUDA_IPC=0 (pinned host memory), and the busbw at 256 MiB
#          against the bound (copy bandwidth / 4).
#       The last line says how many steps failed.
set -u

bundle() {
  local dir=$1
  [ -x build/src/libbraid.so.0 ] || [ -e build/src/libbraid.so.0 ] ||
    { echo "no CUDA build in ./build" >&2; exit 2; }
  rm -rf "$dir" && mkdir -p "$dir/build/src" "$dir/build/tests/cuda" "$dir/build/perf" \
    "$dir/build/tools" "$dir/lib"
  cp -P build/src/libbraid.so build/src/libbraid.so.0 build/src/libbraid.so.0.*[0-9] "$dir/build/src/"
  cp build/tests/cuda/cuda_device_reduce build/tests/cuda/cuda_gpu_collectives "$dir/build/tests/cuda/"
  cp build/perf/*_perf build/perf/gpu_copy_bandwidth "$dir/build/perf/"
  cp build/tools/braidrun "$dir/build/tools/"
  # Every shared library they need but glibc's own and the CUDA driver.
  find "$dir/build" -type f -perm -u+x -exec ldd {} \; 2>/dev/null | awk '/=> \//{print $3}' |
    sort -u | grep -v "^$dir/" |
    grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda)\.so' |
    while read -r lib; do cp -L "$lib" "$dir/lib/"; done
  du -sh "$dir"
}

failures=0
step() {  # step NAME SECONDS COMMAND...: runs and logs COMMAND, counting a failure
  local name=$1 seconds=$2
  shift 2
  echo "=== $name: $*"
  local start=$SECONDS
  timeout --kill-after=10 "$seconds" "$@"
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || failures=$((failures + 1))
}

run() {
  local dir=$1 out=$2
  mkdir -p "$out"
  exec > >(tee "$out/gpu-checks.log") 2>&1
  export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  local b=$dir/build braidrun=$dir/build/tools/braidrun
  nvidia-smi -L
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  step kernels 120 "$b/tests/cuda/cuda_device_reduce"
  step collectives 300 "$b/tests/cuda/cuda_gpu_collectives"
  local sanitizer="compute-sanitizer --error-exitcode 9 --target-processes all"
  step memcheck-kernels 240 $sanitizer --tool memcheck "$b/tests/cuda/cuda_device_reduce" \
    --gtest_filter='*Float*:*Half*:*BFloat*'
  for perf in all_reduce_perf all_gather_perf reduce_scatter_perf; do
    step "memcheck-$perf" 120 $sanitizer --tool memcheck \
      "$braidrun" -n 2 "$b/perf/$perf" -M cuda -b 8 -e 4M -f 8 -n 2 -w 1 -c 1
  done
  step racecheck-all_reduce 180 $sanitizer --tool racecheck \
    "$braidrun" -n 2 "$b/perf/all_reduce_perf" -M cuda -b 1K -e 1M -f 32 -n 1 -w 1 -c 1
  step copy-bandwidth 60 "$b/perf/gpu_copy_bandwidth"
  step all_reduce-cuda_ipc 180 "$braidrun" -n 2 "$b/perf/all_reduce_perf" -M cuda \
    -b 8 -e 256M -f 2 -c 1
  BRAID_CUDA_IPC=0 step all_reduce-pinned 180 "$braidrun" -n 2 "$b/perf/all_reduce_perf" \
    -M cuda -b 8 -e 256M -f 4 -c 1
  # Send/Recv of GPU memory: pieces through pinned memory, checked (-c 1).
  step sendrecv-pieces 120 "$braidrun" -n 2 "$b/perf/sendrecv_perf" -M cuda -b 8 -e 256M -f 4 -c 1
  local bound busbw
  bound=$(awk '/busbw bound/{print $(NF-1)}' "$out/gpu-checks.log" | tail -1)
  # Rank 0's row of 256 MiB: "[0] size count type redop root time algbw busbw
  # #wrong time algbw busbw #wrong", out of place then in place.
  busbw=$(awk '/^=== all_reduce-cuda_ipc: /{on=1} on && $1 == "[0]" && $2 == 268435456 {print $9; exit}' \
    "$out/gpu-checks.log")
  echo "AllReduce 256 MiB busbw (out of place) over cuda_ipc: ${busbw:-?} GB/s; bound: ${bound:-?} GB/s"
  if [ -n "$bound" ] && [ -n "$busbw" ]; then
    awk -v b="$busbw" -v l="$bound" 'BEGIN{r=b/l; printf "ratio %.2f (at least 0.70 wanted): %s\n", r, r >= 0.7 ? "met" : "NOT met"; exit !(r >= 0.7)}' ||
      failures=$((failures + 1))
  else
    failures=$((failures + 1))
  fi
  echo "$failures steps failed"
  [ "$failures" -eq 0 ]
}

case "${1:-}" in
  bundle) bundle "${2:?bundle DIR}" ;;
  run) run "${2:?run DIR OUT}" "${3:?run DIR OUT}" ;;
  *) echo "usage: $0 bundle DIR | run DIR OUT" >&2; exit 2 ;;
esac
