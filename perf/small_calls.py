#!/usr/bin/env python3
"""Small collectives on one host: the shared-memory board against the engine and Open MPI.

For every collective of the perf suite and each size, the time per call (out of place) of
  board   braid as it runs by default (calls that fit a slot go through the board),
  engine  braid with BRAID_SHM_BOARD=0 (the same calls as messages through the algorithms),
  ompi    Open MPI over shared memory (pml ob1, btl self,vader), where mpi_bench has the call,
each from its own launch. The launches are interleaved (repetition outer, then collective,
then board / engine / ompi), because this machine's speed changes from one launch to the next
(where the processes land); the table shows the median over repetitions and the ratios of the
medians. Sizes follow nccl-tests: AllGather's is the output, ReduceScatter's the input, AllToAll's
a rank's send buffer.

  perf/small_calls.py --build build --ranks 2 --reps 9
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

from compare_anchors import size_arg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZES = [64, 256, 1024, 4096]
# perf binary, mpi_bench's name for the call (None: it has none)
COLLECTIVES = [("all_reduce", "allreduce"), ("broadcast", "bcast"), ("reduce", None),
               ("all_gather", "allgather"), ("reduce_scatter", "reduce_scatter"),
               ("alltoall", "alltoall"), ("gather", None), ("scatter", None)]


def run_braid(args, binary, extra_env):
    env = dict(os.environ, **extra_env)
    cmd = [os.path.join(args.build, "tools", "braidrun"), "-n", str(args.ranks),
           os.path.join(args.build, "perf", f"{binary}_perf"), "-b", str(SIZES[0]),
           "-e", str(SIZES[-1]), "-f", "4", "-n", str(args.iters), "-w", str(args.iters // 10)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    if out.returncode != 0:
        sys.exit(f"small_calls.py: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    times = {}
    for line in out.stdout.splitlines():
        if re.match(r"^\[0\] +[0-9]", line):
            fields = line.split()
            # [0] size count type redop root | time algbw busbw #wrong | time ...
            times[int(fields[1])] = float(fields[-8])
    return times


def run_ompi(args, op):
    binary = os.path.join(args.anchors, "mpi_bench_openmpi")
    cmd = ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", str(args.ranks),
           "--mca", "pml", "ob1", "--mca", "btl", "self,vader", binary, "-o", op,
           "-s", ",".join(size_arg(s) for s in SIZES), "--budget", "0.3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        sys.exit(f"small_calls.py: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    times = {}
    for line in out.stdout.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[0] == op:
            count = int(fields[2])
            times[count * 4] = float(fields[3])  # float32 elements; median time in us
    return times


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--iters", type=int, default=5000, help="timed calls per size (braid)")
    p.add_argument("--anchors", default="/tmp/anchors",
                   help="folder with mpi_bench_openmpi (../shared/anchors, BUILD_ONLY=1 run.sh); "
                        "without it the Open MPI column stays empty")
    p.add_argument("--timeout", type=int, default=300)
    args = p.parse_args()
    with_ompi = os.access(os.path.join(args.anchors, "mpi_bench_openmpi"), os.X_OK)
    samples = {}
    for _ in range(args.reps):
        for binary, op in COLLECTIVES:
            for label, env in (("board", {}), ("engine", {"BRAID_SHM_BOARD": "0"})):
                for size, t in run_braid(args, binary, env).items():
                    samples.setdefault((binary, label, size), []).append(t)
            if op and with_ompi:
                for size, t in run_ompi(args, op).items():
                    samples.setdefault((binary, "ompi", size), []).append(t)

    def median(binary, label, size):
        values = samples.get((binary, label, size))
        return statistics.median(values) if values else None

    print(f"# {args.ranks} ranks, {os.cpu_count()} cores; median of {args.reps} interleaved "
          f"launches; us per call, out of place")
    print(f"{'collective':<15}{'bytes':>6}{'board':>8}{'engine':>8}{'Open MPI':>10}"
          f"{'engine/board':>14}{'ompi/board':>12}")
    for binary, _ in COLLECTIVES:
        for size in SIZES:
            board, engine, ompi = (median(binary, label, size)
                                   for label in ("board", "engine", "ompi"))
            if board is None or engine is None:
                continue
            ompi_text = f"{ompi:.2f}" if ompi else "-"
            ratio_text = f"{ompi / board:.2f}" if ompi else "-"
            print(f"{binary:<15}{size:>6}{board:>8.2f}{engine:>8.2f}{ompi_text:>10}"
                  f"{engine / board:>14.2f}{ratio_text:>12}")


if __name__ == "__main__":
    main()
