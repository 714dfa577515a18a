#!/usr/bin/env bash
# The checks of braid's CUDA build that need a GPU, in one run of a few
# minutes, for a GPU machine that may lack the build's dependencies.
#
#   tools/gpu-checks.sh bundle DIR      (on the build machine, after a CUDA
#       build in ./build) copies the CUDA tests, the perf binaries, braidrun,
#       libbraid and the shared libraries they need (not glibc) into DIR;
#   tools/gpu-checks.sh run DIR OUT [core|more|tune|all]   (on the GPU machine)
#       runs, each step under a time limit and all within GPU_CHECKS_SECONDS
#       (default 500: one command of the device's), and logs to
#       OUT/gpu-checks.log and OUT/steps-PHASE.tgz. First it checks that the
#       driver can run the bundle's CUDA version and prints the compute
#       mode. Phase core (the default):
#       1. the kernels against the host reference (cuda_device_reduce);
#       2. the GPU's copy bandwidth; AllReduce among 2 processes on the
#          one GPU (8 B to 1 GiB) over cuda_ipc with every message through
#          the slots (BRAID_CUDA_IPC_DIRECT_BYTES=0), then read in place
#          from buffers of braidMemAlloc (-R 1, the default minimum), then
#          1 GiB with 4, 128 and 512 MiB slots (BRAID_CUDA_IPC_SLOT_BYTES);
#          and the best busbw read in place against the bound (copy
#          bandwidth / 4);
#       3. every collective among 2, 3 and 4 processes on GPU 0, on stream
#          NULL and on a CUDA stream, each way of exporting memory, and read
#          in place (cuda_gpu_collectives);
#       4. compute-sanitizer memcheck on the kernels of every float type.
#       Phase more: memcheck on AllReduce, AllGather and ReduceScatter among
#       2 processes, and on AllReduce read in place (cudaMalloc buffers with
#       BRAID_CUDA_IPC_DIRECT_BYTES=1, and braidMemAlloc's); AllReduce with
#       BRAID_CUDA_IPC=0 (pinned host memory); AllReduce at one rank;
#       Send/Recv of GPU memory in pieces. (The kernels use no shared
#       memory, so racecheck has nothing to check.)
#       Phase tune: what a turn between 2 processes on the GPU costs
#       (gpu_handoff), every AllReduce algorithm among 2 processes (read in
#       place), the warning that they share the GPU, and AllReduce at 2
#       (through the slots and read in place) and 4 ranks under MPS (a
#       daemon of the run's own), where no warning is wanted.
#       The last line says how many steps failed or did not run; the
#       steps' own logs are in OUT/steps-PHASE.tgz.
set -u

bundle() {
  local dir=$1
  [ -x build/src/libbraid.so.0 ] || [ -e build/src/libbraid.so.0 ] ||
    { echo "no CUDA build in ./build" >&2; exit 2; }
  rm -rf "$dir" && mkdir -p "$dir/build/src" "$dir/build/tests/cuda" "$dir/build/perf" \
    "$dir/build/tools" "$dir/lib"
  cp -P build/src/libbraid.so build/src/libbraid.so.0 build/src/libbraid.so.0.*[0-9] "$dir/build/src/"
  cp build/tests/cuda/cuda_device_reduce build/tests/cuda/cuda_gpu_collectives "$dir/build/tests/cuda/"
  cp build/perf/*_perf build/perf/gpu_copy_bandwidth build/perf/gpu_handoff "$dir/build/perf/"
  cp build/tools/braidrun "$dir/build/tools/"
  # The CUDA version the runtime inside libbraid was built with: the driver
  # on the GPU machine must be at least as new.
  nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' > "$dir/cuda-version"
  # Every shared library they need but glibc's own and the CUDA driver.
  find "$dir/build" -type f -perm -u+x -exec ldd {} \; 2>/dev/null | awk '/=> \//{print $3}' |
    sort -u | grep -v "^$dir/" |
    grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda)\.so' |
    while read -r lib; do cp -L "$lib" "$dir/lib/"; done
  du -sh "$dir"
}

failures=0
budget=${GPU_CHECKS_SECONDS:-500}
self=$(readlink -f "$0")  # steps run its `says` under timeout, which needs a program
out_dir=.
step() {  # step NAME SECONDS COMMAND...: runs and logs COMMAND, counting a failure
  local name=$1 seconds=$2
  shift 2
  local left=$((budget - SECONDS))
  if [ "$left" -lt 20 ]; then
    echo "=== $name: not run, $left s of the budget left"
    failures=$((failures + 1))
    return
  fi
  [ "$seconds" -le "$left" ] || seconds=$left
  echo "=== $name: $*"
  local start=$SECONDS
  timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee "$out_dir/steps/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || failures=$((failures + 1))
}

# The driver must support the bundle's CUDA version (CUDA 12.x: driver 525
# or newer, 13.x: 580), or every GPU call fails with "insufficient driver".
check_driver() {
  local dir=$1 major minor driver need
  read -r major minor < "$dir/cuda-version" || { echo "no $dir/cuda-version"; return 1; }
  command -v nvidia-smi > /dev/null || { echo "no nvidia-smi here: not a GPU machine"; return 1; }
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
  case "$major" in 12) need=525 ;; 13) need=580 ;; *) need=0 ;; esac
  echo "bundle built with CUDA $major.$minor; driver $driver (needs $need or newer)"
  nvidia-smi --query-gpu=name,compute_mode,memory.total --format=csv
  if [ "${driver%%.*}" -lt "$need" ]; then
    echo "the driver is too old for this build: rebuild with a CUDA the driver supports"
    return 1
  fi
  if nvidia-smi --query-gpu=compute_mode --format=csv,noheader | grep -qi exclusive; then
    echo "warning: the GPU is in an exclusive compute mode: several processes cannot share it"
  fi
}

core_steps() {
  local b=$1 braidrun=$1/tools/braidrun
  step kernels 90 "$b/tests/cuda/cuda_device_reduce"
  # The perf runs before the longer tests, so that a test that hangs until
  # its limit does not leave them without time.
  step copy-bandwidth 60 "$b/perf/gpu_copy_bandwidth"
  # Every message through the slots, none read in place: the path
  # measured before, for the ratio of the two ways.
  BRAID_CUDA_IPC_DIRECT_BYTES=0 step all_reduce-slots-only 60 "$braidrun" -n 2 \
    "$b/perf/all_reduce_perf" -M cuda -b 8 -e 1G -f 8 -n 20 -w 5 -c 1
  # Reads in place, by default, of braidMemAlloc's buffers (-R 1).
  step all_reduce-cuda_ipc 150 "$braidrun" -n 2 \
    "$b/perf/all_reduce_perf" -M cuda -R 1 -b 8 -e 1G -f 2 -c 1
  # 1 GiB with smaller and larger cuda_ipc slots (the schedule's chunks)
  # than the default 32 MiB: between processes that share the GPU each
  # chunk handed over costs a switch of the GPU between them.
  local slot
  for slot in 4M 128M 512M; do
    BRAID_CUDA_IPC_SLOT_BYTES=$slot step "all_reduce-slot-$slot" \
      60 "$braidrun" -n 2 "$b/perf/all_reduce_perf" -M cuda -R 1 -b 1G -e 1G -n 20 -w 5 -c 1
  done
  local bound busbw
  bound=$(awk '/busbw bound/{print $(NF-1)}' "$out_dir/steps/copy-bandwidth.log" | tail -1)
  # The best of rank 0's rows over the runs with reads in place: "[0] size
  # count type redop root time algbw busbw #wrong time algbw busbw #wrong",
  # out of place then in place.
  busbw=$(cd "$out_dir/steps" && awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ && $9 + 0 > best {
      best = $9 + 0; size = $2; run = FILENAME} END {if (size) print best, size, run}' \
      all_reduce-cuda_ipc.log all_reduce-slot-*.log)
  echo "AllReduce best busbw (out of place) over cuda_ipc: ${busbw:-?} (GB/s, bytes, run); bound: ${bound:-?} GB/s"
  busbw=${busbw%% *}
  if [ -n "$bound" ] && [ -n "$busbw" ]; then
    awk -v b="$busbw" -v l="$bound" 'BEGIN{r=b/l; ok = (r >= 0.7); printf "ratio %.2f (at least 0.70 wanted): %s\n", r, (ok ? "met" : "NOT met"); exit !ok}' ||
      failures=$((failures + 1))
  else
    failures=$((failures + 1))
  fi
  step collectives 330 "$b/tests/cuda/cuda_gpu_collectives" \
    --gtest_filter='-GpuCaptures.*:GpuFirstCalls.*'
  step memcheck-kernels 150 compute-sanitizer --error-exitcode 9 --tool memcheck \
    "$b/tests/cuda/cuda_device_reduce" --gtest_filter='*float*'
}

more_steps() {
  local b=$1 braidrun=$1/tools/braidrun
  for perf in all_reduce_perf all_gather_perf reduce_scatter_perf; do
    step "memcheck-$perf" 100 compute-sanitizer --error-exitcode 9 --target-processes all \
      --tool memcheck "$braidrun" -n 2 "$b/perf/$perf" -M cuda -b 8 -e 4M -f 8 -n 2 -w 1 -c 1
  done
  # The same AllReduce with every message read in place.
  BRAID_CUDA_IPC_DIRECT_BYTES=1 step "memcheck-all_reduce_perf-in-place" 100 compute-sanitizer \
    --error-exitcode 9 --target-processes all --tool memcheck "$braidrun" -n 2 \
    "$b/perf/all_reduce_perf" -M cuda -b 8 -e 4M -f 8 -n 2 -w 1 -c 1
  step "memcheck-all_reduce_perf-mem-alloc" 100 compute-sanitizer \
    --error-exitcode 9 --target-processes all --tool memcheck "$braidrun" -n 2 \
    "$b/perf/all_reduce_perf" -M cuda -R 1 -b 8 -e 4M -f 8 -n 2 -w 1 -c 1
  BRAID_CUDA_IPC=0 step all_reduce-pinned 120 "$braidrun" -n 2 "$b/perf/all_reduce_perf" \
    -M cuda -b 8 -e 256M -f 4 -c 1
  # One rank alone: its calls run on the GPU, not through host memory.
  step all_reduce-one-rank 60 "$braidrun" -n 1 "$b/perf/all_reduce_perf" -M cuda -b 8 -e 1G -f 32 -c 1
  # Send/Recv of GPU memory: pieces through pinned memory, checked (-c 1).
  step sendrecv-pieces 100 "$braidrun" -n 2 "$b/perf/sendrecv_perf" -M cuda -b 8 -e 256M -f 4 -c 1
  # Calls while another thread captures a CUDA graph, and one on the
  # capturing stream (refused).
  step captures 60 "$b/tests/cuda/cuda_gpu_collectives" --gtest_filter='GpuCaptures.*'
  # The first calls on a CUDA stream, each followed at once by a copy to
  # pageable memory on that stream (docs/GPU.md, "What braid's threads do
  # not do while a CUDA stream waits"); a rank that hangs is killed at 60 s.
  step first-calls 90 "$b/tests/cuda/cuda_gpu_collectives" --gtest_filter='GpuFirstCalls.*'
}

# What the defaults should be, between processes that share the GPU: every
# AllReduce algorithm at 2 ranks, and the same with MPS, where the processes
# run at once rather than take turns; and whether braid tells the two apart.
tune_steps() {
  local b=$1 braidrun=$1/tools/braidrun algorithm
  # What one turn between two processes on the GPU costs, by how each waits.
  step gpu-handoff 45 "$b/perf/gpu_handoff"
  for algorithm in butterfly dbtree ring halving; do
    BRAID_ALGO=allreduce=$algorithm step "algorithm-$algorithm" \
      45 "$braidrun" -n 2 "$b/perf/all_reduce_perf" -M cuda -R 1 -b 8 -e 1G -f 8 -n 10 -w 3 -c 1
  done
  # Two ranks on the one GPU without MPS: the first rank says so.
  step shared-gpu-warning 30 "$self" says yes "$braidrun" -n 2 "$b/perf/all_reduce_perf" -M cuda \
    -b 8 -e 8 -c 1
  if ! command -v nvidia-cuda-mps-control > /dev/null; then
    echo "=== mps: not run, no nvidia-cuda-mps-control here"
    return
  fi
  # A daemon of this run's own (its own pipe directory), stopped at the end.
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  if nvidia-cuda-mps-control -d; then
    step mps-all_reduce 60 "$braidrun" -n 2 "$b/perf/all_reduce_perf" -M cuda -b 8 -e 1G -f 8 \
      -n 10 -w 3 -c 1
    step mps-all_reduce-in-place 60 "$braidrun" -n 2 \
      "$b/perf/all_reduce_perf" -M cuda -R 1 -b 8 -e 1G -f 8 -n 10 -w 3 -c 1
    step mps-all_reduce-4-ranks 60 "$braidrun" -n 4 "$b/perf/all_reduce_perf" -M cuda -b 8 \
      -e 1G -f 8 -n 10 -w 3 -c 1
    # Under MPS nothing is said.
    step mps-no-warning 30 "$self" says no "$braidrun" -n 2 "$b/perf/all_reduce_perf" -M cuda -b 8 \
      -e 8 -c 1
    echo quit | nvidia-cuda-mps-control
  else
    echo "=== mps: the daemon did not start"
    failures=$((failures + 1))
  fi
  rm -rf "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

# says yes|no COMMAND...: runs COMMAND, which must succeed, and fails unless
# its output warns that ranks share a GPU (yes) or does not (no).
says() {
  local want=$1 output rc
  shift
  output=$("$@" 2>&1)
  rc=$?
  printf '%s\n' "$output"
  [ "$rc" -eq 0 ] || { echo "says: the command failed (exit $rc)"; return 1; }
  if printf '%s\n' "$output" | grep -q 'ranks of this host share its'; then
    [ "$want" = yes ] || { echo "says: a warning that was not wanted"; return 1; }
  else
    [ "$want" = no ] || { echo "says: no warning that ranks share the GPU"; return 1; }
  fi
}

run_steps() {
  local dir=$1 phase=$2
  export LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi -L 2>&1
  if ! check_driver "$dir"; then
    echo "1 steps failed"
    return 1
  fi
  case "$phase" in
    core) core_steps "$dir/build" ;;
    more) more_steps "$dir/build" ;;
    tune) tune_steps "$dir/build" ;;
    all) core_steps "$dir/build" && more_steps "$dir/build" && tune_steps "$dir/build" ;;
    *) echo "unknown phase $phase"; return 2 ;;
  esac
  echo "$failures steps failed"
  [ "$failures" -eq 0 ]
}

run() {
  local dir=$1
  out_dir=$2
  mkdir -p "$out_dir/steps"
  # A pipeline, not a redirection to a process substitution: the log is
  # complete when this returns.
  run_steps "$dir" "${3:-core}" 2>&1 | tee "$out_dir/gpu-checks.log"
  local rc=${PIPESTATUS[0]}
  # One archive of the steps' logs: a lent machine returns only a few files.
  tar czf "$out_dir/steps-${3:-core}.tgz" -C "$out_dir" steps && rm -rf "$out_dir/steps"
  return "$rc"
}

case "${1:-}" in
  bundle) bundle "${2:?bundle DIR}" ;;
  run) run "${2:?run DIR OUT}" "${3:?run DIR OUT}" "${4:-core}" ;;
  says) shift; says "$@" ;;
  *) echo "usage: $0 bundle DIR | run DIR OUT [core|more|tune|all]" >&2; exit 2 ;;
esac
