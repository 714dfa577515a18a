#!/usr/bin/env bash
# The checks of braid's CUDA build that need a GPU, in one run of a few
# minutes, for a GPU machine that may lack the build's dependencies.
#
#   tools/gpu-checks.sh bundle DIR      (on the build machine, after a CUDA
#       build in ./build) copies the CUDA tests, the perf binaries, braidrun,
#       libbraid and the shared libraries they need (not glibc) into DIR;
#   tools/gpu-checks.sh run DIR OUT [PHASES]   (on the GPU machine; PHASES
#       is core (the default), more, tune, all, or a list such as core,more)
#       runs, each step under a time limit and all within GPU_CHECKS_SECONDS
#       (default 540: one command of the device's is at most 600), and logs
#       to OUT/gpu-checks.log and OUT/steps-PHASE.tgz, both brought up to
#       date after every step, so that a run cut short still returns them.
#       First it prints the bundle's provenance and checks that the driver can
#       run the bundle's CUDA version; every call of a step fails at
#       BRAID_TIMEOUT (30 s unless set), so a hang costs a step, not the run.
#       Phase core:
#       1. the kernels against the host reference (cuda_device_reduce);
#       2. the GPU's copy bandwidth; AllReduce among 2 processes on the
#          one GPU (8 B to 1 GiB) over cuda_ipc with every message through
#          the slots (BRAID_CUDA_IPC_DIRECT_BYTES=0), then read in place
#          from buffers of braidMemAlloc (-R 1, the default minimum), 8 B to
#          1 GiB and 2 to 4 GiB, then 1 GiB with 4, 128 and 512 MiB slots
#          (BRAID_CUDA_IPC_SLOT_BYTES); busbw against the bound (copy
#          bandwidth / 4) at each size read in place, the best of them
#          (0.70 wanted, no wrong value), and the 8-byte times;
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
#       (through the slots, and read in place from 1 MiB to 4 GiB with its
#       ratio to the bound) and 4 ranks under MPS (a daemon of the run's
#       own, stopped at the end or when the run is cut short), where no
#       warning is wanted.
#       The last line says how many steps failed or did not run; the
#       steps' own logs are in OUT/steps-PHASE.tgz.
set -u

bundle() (
  set -e
  local dir
  dir=$(realpath -m "$1")
  [ -e build/src/libbraid.so.0 ] || { echo "no build in ./build" >&2; exit 2; }
  [ -x build/tests/cuda/cuda_device_reduce ] && [ -x build/perf/gpu_handoff ] ||
    { echo "./build has no CUDA tests: configure it with -Dcuda=enabled" >&2; exit 2; }
  command -v nvcc > /dev/null || { echo "no nvcc on PATH (/usr/local/cuda/bin)" >&2; exit 2; }
  # A bundle of an out-of-date build would spend the GPU's time on old code.
  if ! ninja -C build -n 2>/dev/null | grep -q "no work to do"; then
    echo "./build is not up to date with the sources: run ninja -C build first" >&2
    exit 2
  fi
  rm -rf "$dir" && mkdir -p "$dir/build/src" "$dir/build/tests/cuda" "$dir/build/perf" \
    "$dir/build/tools" "$dir/lib"
  cp -P build/src/libbraid.so build/src/libbraid.so.0 build/src/libbraid.so.0.*[0-9] "$dir/build/src/"
  cp build/tests/cuda/cuda_device_reduce build/tests/cuda/cuda_gpu_collectives "$dir/build/tests/cuda/"
  cp build/perf/*_perf build/perf/gpu_copy_bandwidth build/perf/gpu_handoff "$dir/build/perf/"
  cp build/tools/braidrun "$dir/build/tools/"
  # The CUDA version the runtime inside libbraid was built with: the driver
  # on the GPU machine must be at least as new.
  nvcc --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1 \2/p' > "$dir/cuda-version"
  [ -s "$dir/cuda-version" ]
  # Every shared library they need but glibc's own and the CUDA driver.
  find "$dir/build" -type f -perm -u+x -exec ldd {} \; 2>/dev/null | awk '/=> \//{print $3}' |
    sort -u | grep -v "^$dir/" |
    grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libcuda)\.so' |
    while read -r lib; do cp -L "$lib" "$dir/lib/"; done
  # What was bundled, printed by run.
  {
    echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)," \
      "$(git status --porcelain 2>/dev/null | wc -l) files changed since"
    echo "bundled $(date -u +%Y-%m-%dT%H:%MZ), CUDA $(tr ' ' . < "$dir/cuda-version")"
  } > "$dir/provenance"
  du -sh "$dir"
)

failures=0
budget=${GPU_CHECKS_SECONDS:-540}
self=$(readlink -f "$0")  # steps run its `says` under timeout, which needs a program
out_dir=.
steps_dir=.    # the steps' logs, outside OUT: archived into OUT after each step
phase=core
bundle_dir=.
step() {  # step NAME SECONDS COMMAND...: runs and logs COMMAND, counting a failure
  local name=$1 seconds=$2
  shift 2
  local left=$((budget - SECONDS))
  if [ "$left" -lt 20 ]; then
    echo "=== $name: not run, $left s of the budget left"
    failures=$((failures + 1))
    return 1
  fi
  [ "$seconds" -le "$left" ] || seconds=$left
  echo "=== $name: $*"
  local start=$SECONDS
  timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee "$steps_dir/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $((SECONDS - start)) s"
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    # Ranks a killed launcher left behind would hold the GPU in later steps.
    pkill -KILL -f -- "$bundle_dir/build/" 2>/dev/null
    sleep 1
  fi
  tar czf "$out_dir/steps-$phase.tgz" -C "$steps_dir" . 2>/dev/null
  [ "$rc" -eq 0 ] || { failures=$((failures + 1)); return 1; }
}

# The driver must support the bundle's CUDA version (CUDA 12.x: driver 525
# or newer, 13.x: 580), or every GPU call fails with "insufficient driver".
check_driver() {
  local dir=$1 major minor driver need
  read -r major minor < "$dir/cuda-version" || { echo "no $dir/cuda-version"; return 1; }
  command -v nvidia-smi > /dev/null || { echo "no nvidia-smi here: not a GPU machine"; return 1; }
  driver=$(timeout 30 nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
  case "$major" in 12) need=525 ;; 13) need=580 ;; *) need=0 ;; esac
  echo "bundle built with CUDA $major.$minor; driver $driver (needs $need or newer)"
  timeout 30 nvidia-smi --query-gpu=name,compute_mode,memory.total --format=csv
  case "${driver%%.*}" in
    '' | *[!0-9]*) echo "nvidia-smi gave no driver version"; return 1 ;;
  esac
  if [ "${driver%%.*}" -lt "$need" ]; then
    echo "the driver is too old for this build: rebuild with a CUDA the driver supports"
    return 1
  fi
  if timeout 30 nvidia-smi --query-gpu=compute_mode --format=csv,noheader | grep -qi exclusive; then
    echo "the GPU is in an exclusive compute mode: several processes cannot share it"
    return 1
  fi
}

# The AllReduce rows of rank 0 in the logs named: "[0] size count type redop
# root time algbw busbw #wrong time algbw busbw #wrong", out of place then in
# place. Prints, per size, the best out-of-place busbw over the logs and its
# ratio to the bound, then the best over every size with no wrong value.
verdict() {
  local bound=$1
  shift
  (cd "$steps_dir" && awk -v bound="$bound" '
    $1 == "[0]" && $2 ~ /^[0-9]+$/ && $10 == 0 && $14 == 0 {
      if ($9 + 0 > best[$2]) { best[$2] = $9 + 0; from[$2] = FILENAME }
    }
    $1 == "[0]" && $2 ~ /^[0-9]+$/ && ($10 != 0 || $14 != 0) { wrong[FILENAME] = 1 }
    END {
      for (size in best) if (best[size] > top) { top = best[size]; at = size; run = from[size] }
      for (f in wrong) printf "wrong values in %s\n", f
      n = 0
      for (size in best) sizes[++n] = size  # the keys, as strings
      for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j)
        if (sizes[j] + 0 < sizes[i] + 0) { t = sizes[i]; sizes[i] = sizes[j]; sizes[j] = t }
      for (i = 1; i <= n; ++i) if (sizes[i] + 0 >= 1048576)
        printf "  %12s B: busbw %8.1f GB/s, %.2f of the bound (%s)\n", sizes[i],
          best[sizes[i]], best[sizes[i]] / bound, from[sizes[i]]
      if (!top || !bound) { print "no AllReduce row or no bound"; exit 1 }
      r = top / bound
      printf "AllReduce best busbw read in place: %.1f GB/s at %.0f B (%s); bound %.1f GB/s; ratio %.2f (at least 0.70 wanted): %s\n",
        top, at + 0, run, bound, r, (r >= 0.7 && length(wrong) == 0 ? "met" : "NOT met")
      exit !(r >= 0.7 && length(wrong) == 0)
    }' "$@")
}

# The 8-byte rows (time in us, out of place and in place) of the logs named.
latency() {
  (cd "$steps_dir" && awk '$1 == "[0]" && $2 == 8 {
      printf "8-byte AllReduce: %s us out of place, %s us in place (%s)\n", $7, $11, FILENAME}' "$@")
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
  if step all_reduce-cuda_ipc 150 "$braidrun" -n 2 \
    "$b/perf/all_reduce_perf" -M cuda -R 1 -b 8 -e 1G -f 2 -w 5 -c 1; then
    # Larger messages: every call pays a few turns between the processes,
    # which weigh less against more bytes (4 GiB: 2^30 floats a rank).
    step all_reduce-large 90 "$braidrun" -n 2 \
      "$b/perf/all_reduce_perf" -M cuda -R 1 -b 2G -e 4G -f 2 -n 10 -w 3 -c 1
    # 1 GiB with smaller and larger cuda_ipc slots (the schedule's chunks)
    # than the default 32 MiB: between processes that share the GPU each
    # chunk handed over costs a switch of the GPU between them.
    local slot
    for slot in 4M 128M 512M; do
      BRAID_CUDA_IPC_SLOT_BYTES=$slot step "all_reduce-slot-$slot" \
        60 "$braidrun" -n 2 "$b/perf/all_reduce_perf" -M cuda -R 1 -b 1G -e 1G -n 20 -w 5 -c 1
    done
  else
    echo "=== all_reduce-large, all_reduce-slot-*: not run (the same path failed)"
  fi
  local bound
  bound=$(awk '/busbw bound/{print $(NF-1)}' "$steps_dir/copy-bandwidth.log" 2>/dev/null | tail -1)
  local logs=()
  for log in all_reduce-cuda_ipc all_reduce-large all_reduce-slot-4M all_reduce-slot-128M \
    all_reduce-slot-512M; do
    [ -s "$steps_dir/$log.log" ] && logs+=("$log.log")
  done
  if [ -n "$bound" ] && [ "${#logs[@]}" -gt 0 ]; then
    verdict "$bound" "${logs[@]}" || failures=$((failures + 1))
  else
    echo "no bound or no AllReduce read in place: the perf target is not measured"
    failures=$((failures + 1))
  fi
  for log in all_reduce-slots-only all_reduce-cuda_ipc; do
    [ -s "$steps_dir/$log.log" ] && latency "$log.log"
  done
  step collectives 300 "$b/tests/cuda/cuda_gpu_collectives" \
    --gtest_filter='-GpuCaptures.*:GpuFirstCalls.*'
  step memcheck-kernels 150 compute-sanitizer --error-exitcode 9 --tool memcheck \
    "$b/tests/cuda/cuda_device_reduce" --gtest_filter='*float*'
}

more_steps() {
  local b=$1 braidrun=$1/tools/braidrun
  for perf in all_reduce_perf all_gather_perf reduce_scatter_perf; do
    BRAID_TIMEOUT=90 step "memcheck-$perf" 100 compute-sanitizer --error-exitcode 9 --target-processes all \
      --tool memcheck "$braidrun" -n 2 "$b/perf/$perf" -M cuda -b 8 -e 4M -f 8 -n 2 -w 1 -c 1
  done
  # The same AllReduce with every message read in place.
  BRAID_TIMEOUT=90 BRAID_CUDA_IPC_DIRECT_BYTES=1 step "memcheck-all_reduce_perf-in-place" 100 \
    compute-sanitizer \
    --error-exitcode 9 --target-processes all --tool memcheck "$braidrun" -n 2 \
    "$b/perf/all_reduce_perf" -M cuda -b 8 -e 4M -f 8 -n 2 -w 1 -c 1
  BRAID_TIMEOUT=90 step "memcheck-all_reduce_perf-mem-alloc" 100 compute-sanitizer \
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
  # A daemon of this run's own (its own pipe directory), stopped at the end,
  # and by the trap where the run is cut short.
  CUDA_MPS_PIPE_DIRECTORY=$(mktemp -d) CUDA_MPS_LOG_DIRECTORY=$(mktemp -d)
  export CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
  trap stop_mps EXIT
  if nvidia-cuda-mps-control -d; then
    step mps-all_reduce 60 "$braidrun" -n 2 "$b/perf/all_reduce_perf" -M cuda -b 8 -e 1G -f 8 \
      -n 10 -w 3 -c 1
    step mps-all_reduce-in-place 90 "$braidrun" -n 2 \
      "$b/perf/all_reduce_perf" -M cuda -R 1 -b 1M -e 4G -f 4 -n 10 -w 3 -c 1
    step mps-copy-bandwidth 60 "$b/perf/gpu_copy_bandwidth"
    local bound
    bound=$(awk '/busbw bound/{print $(NF-1)}' "$steps_dir/mps-copy-bandwidth.log" | tail -1)
    [ -s "$steps_dir/mps-all_reduce-in-place.log" ] && [ -n "$bound" ] &&
      { verdict "$bound" mps-all_reduce-in-place.log || true; }
    step mps-all_reduce-4-ranks 60 "$braidrun" -n 4 "$b/perf/all_reduce_perf" -M cuda -b 8 \
      -e 1G -f 8 -n 10 -w 3 -c 1
    # Under MPS nothing is said.
    step mps-no-warning 30 "$self" says no "$braidrun" -n 2 "$b/perf/all_reduce_perf" -M cuda -b 8 \
      -e 8 -c 1
  else
    echo "=== mps: the daemon did not start"
    failures=$((failures + 1))
  fi
  stop_mps
  trap - EXIT
}

# Stops this run's MPS daemon (a client left by a killed step may keep it
# waiting: then it is killed), keeping its logs with the steps'.
stop_mps() {
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] || return 0
  if ! timeout 20 sh -c 'echo quit | nvidia-cuda-mps-control'; then
    pkill -KILL -f nvidia-cuda-mps 2>/dev/null
  fi
  cp "$CUDA_MPS_LOG_DIRECTORY/control.log" "$steps_dir/mps-control.log" 2>/dev/null
  cp "$CUDA_MPS_LOG_DIRECTORY/server.log" "$steps_dir/mps-server.log" 2>/dev/null
  tar czf "$out_dir/steps-$phase.tgz" -C "$steps_dir" . 2>/dev/null
  rm -rf "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
}

# says yes|no COMMAND...: runs COMMAND, which must succeed, and fails unless
# its output warns that ranks share a GPU (yes) or does not (no).
says() {
  local want=$1 rc log
  shift
  log=$(mktemp)
  "$@" > "$log" 2>&1
  rc=$?
  cat "$log"
  if [ "$rc" -ne 0 ]; then
    echo "says: the command failed (exit $rc)"
  elif grep -q 'ranks of this host share its' "$log"; then
    [ "$want" = yes ] || { echo "says: a warning that was not wanted"; rc=1; }
  else
    [ "$want" = no ] || { echo "says: no warning that ranks share the GPU"; rc=1; }
  fi
  rm -f "$log"
  [ "$rc" -eq 0 ]
}

run_steps() {
  local phases=$1
  export LD_LIBRARY_PATH="$bundle_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # A call that hangs fails at this, naming the peer it waited for, well
  # within its step's limit.
  export BRAID_TIMEOUT=${BRAID_TIMEOUT:-30}
  cat "$bundle_dir/provenance" 2>/dev/null || echo "a bundle without provenance"
  timeout 30 nvidia-smi -L 2>&1
  if ! check_driver "$bundle_dir"; then
    echo "1 steps failed"
    return 1
  fi
  [ "$phases" = all ] && phases=core,more,tune
  local each
  for each in ${phases//,/ }; do
    case "$each" in
      core | more | tune) ;;
      *) echo "unknown phase $each"; return 2 ;;
    esac
    phase=$each
    steps_dir=$(mktemp -d)
    echo "##### phase $each"
    "${each}_steps" "$bundle_dir/build"
    rm -rf "$steps_dir"
  done
  echo "$failures steps failed"
  [ "$failures" -eq 0 ]
}

run() {
  bundle_dir=$(realpath "$1")
  out_dir=$(realpath -m "$2")
  mkdir -p "$out_dir"
  # A pipeline, not a redirection to a process substitution: the log is
  # complete when this returns. Each phase's step logs are archived as
  # OUT/steps-PHASE.tgz after every step (a lent machine returns only a few
  # files, and nothing of a command cut short but what is in OUT).
  run_steps "${3:-core}" 2>&1 | tee "$out_dir/gpu-checks.log"
  return "${PIPESTATUS[0]}"
}

case "${1:-}" in
  bundle) bundle "${2:?bundle DIR}" ;;
  run) run "${2:?run DIR OUT}" "${3:?run DIR OUT}" "${4:-core}" ;;
  says) shift; says "$@" ;;
  *) echo "usage: $0 bundle DIR | run DIR OUT [core|more|tune|all|core,more,...]" >&2; exit 2 ;;
esac
