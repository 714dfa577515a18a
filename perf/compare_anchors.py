#!/usr/bin/env python3
"""Interleaved comparison of braid's AllReduce with Gloo and Open MPI.

Runs, for every size, braid's all_reduce_perf and each anchor benchmark one
after the other, REPS times, so that all of them see the same machine state,
and prints per size the median time of each and the ratio anchor/braid
(above 1: braid is faster). The anchors are the Gloo and MPI benchmark
programs built by the anchor suite (gloo_bench, mpi_bench_openmpi).

  perf/compare_anchors.py --build build --anchors /path/to/anchors -n 2 --reps 5
"""
import argparse
import re
import statistics
import subprocess
import sys


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def braid_time_us(args, size):
    out = subprocess.run(
        [f"{args.build}/tools/braidrun", "-n", str(args.ranks), f"{args.build}/perf/all_reduce_perf",
         "-b", str(size), "-e", str(size), "-n", str(args.iters), "-w", "3", "-c", "0"],
        capture_output=True, text=True, timeout=600, check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 6 and fields[0] == "[0]" and fields[1] == str(size):
            return float(fields[6])
    raise RuntimeError("no result row in braid output:\n" + out)


def anchor_time_us(command, size, label):
    out = subprocess.run(command + ["-s", str(size)], capture_output=True, text=True, timeout=600,
                         check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if fields and not fields[0].startswith("#") and len(fields) > 3 and fields[0] == label:
            return float(fields[3])
    raise RuntimeError("no result row in anchor output:\n" + out)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--anchors", required=True, help="folder with gloo_bench and mpi_bench_openmpi")
    p.add_argument("-n", "--ranks", type=int, default=2)
    p.add_argument("--sizes", default="8,64K,1M,32M")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    mpirun = ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", str(args.ranks),
              "--mca", "pml", "ob1"]
    anchors = {
        "gloo tcp (allreduce_new_ring)": (
            [f"{args.anchors}/gloo_bench", "-n", str(args.ranks), "-o", "allreduce_new_ring",
             "--budget", "0.5"], "allreduce_new_ring"),
        "openmpi tcp(lo)": (
            mpirun + ["--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
                      f"{args.anchors}/mpi_bench_openmpi", "-o", "allreduce", "--budget", "0.5"],
            "allreduce"),
        "openmpi shm (vader)": (
            mpirun + ["--mca", "btl", "self,vader", f"{args.anchors}/mpi_bench_openmpi", "-o",
                      "allreduce", "--budget", "0.5"], "allreduce"),
    }
    print(f"# AllReduce float32 sum, {args.ranks} ranks, {args.reps} interleaved repetitions;"
          " time = median over repetitions of each program's own per-call time (us);"
          " ratio = anchor time / braid time (> 1: braid faster), median of the per-repetition ratios")
    print(f"{'size':>8} {'braid us':>10} " + " ".join(f"{name:>30}" for name in anchors))
    for size_text in args.sizes.split(","):
        size = parse_size(size_text)
        braid, others = [], {name: [] for name in anchors}
        for _ in range(args.reps):
            braid.append(braid_time_us(args, size))
            for name, (command, label) in anchors.items():
                others[name].append(anchor_time_us(command, size, label))
        cells = []
        for name in anchors:
            ratios = [o / b for o, b in zip(others[name], braid)]
            cells.append(f"{statistics.median(others[name]):>10.1f} us  x{statistics.median(ratios):>5.2f}")
        print(f"{size_text:>8} {statistics.median(braid):>10.1f} " + " ".join(f"{c:>30}" for c in cells))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
