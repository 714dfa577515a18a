#!/usr/bin/env python3
"""Large collectives on one host: buffers of malloc against buffers of braidHostAlloc.

For every collective of the perf suite and each size, the bus bandwidth (GB/s, nccl-tests'
factors) out of place and in place, of
  malloc     the perf binary as it runs by default (buffers from aligned_alloc: a large message
             is read with process_vm_readv, and the sender writes half of a plain one),
  hostalloc  the same with -R 1 (buffers from braidHostAlloc: the receiver maps the sender's
             allocation and copies or reduces from it with memory instructions),
each from its own launch. Launches are interleaved (repetition outer, then collective, then
malloc / hostalloc), because this machine's speed changes from one launch to the next; the
table shows the median over repetitions and the ratio of the medians.

  perf/host_alloc.py --build build --ranks 2 --reps 5
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from compare_anchors import size_arg, size_text

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "alltoall",
               "gather", "scatter", "sendrecv"]


def run(args, binary, register, json_path):
    cmd = [os.path.join(args.build, "tools", "braidrun"), "-n", str(args.ranks),
           os.path.join(args.build, "perf", f"{binary}_perf"), "-b", size_arg(args.sizes[0]),
           "-e", size_arg(args.sizes[-1]), "-f", "8", "-n", str(args.iters), "-w", "2",
           "-c", "1", "-a", "3", "-R", str(register), "-J", json_path]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode != 0:
        sys.exit(f"host_alloc.py: {' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    with open(json_path) as f:
        rows = json.load(f)["rows"]
    figures = {}
    for row in rows:
        for placement in ("out_of_place", "in_place"):
            m = row[placement]
            if m["time_us"] is not None:
                if m.get("wrong"):
                    sys.exit(f"host_alloc.py: {binary} -R {register} had wrong values")
                figures[(row["size"], placement)] = m["busbw_gbps"]
    return figures


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--iters", type=int, default=10, help="timed calls per size (default 10)")
    p.add_argument("--only", default="", help="comma-separated collectives (default: all)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per launch")
    args = p.parse_args()
    args.sizes = [1 << 20, 8 << 20, 64 << 20]
    collectives = args.only.split(",") if args.only else COLLECTIVES
    samples = {}  # (collective, variant, size, placement) -> [busbw]
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for binary in collectives:
                order = [0, 1] if rep % 2 == 0 else [1, 0]
                for register in order:
                    figures = run(args, binary, register, os.path.join(tmp, "run.json"))
                    for (size, placement), busbw in figures.items():
                        samples.setdefault((binary, register, size, placement), []).append(busbw)
            print(f"# repetition {rep + 1}/{args.reps} done", file=sys.stderr)
    print(f"# {args.ranks} ranks, busbw GB/s, median of {args.reps} interleaved launches each; "
          "ratio = hostalloc / malloc")
    print("| collective | size | malloc oop | hostalloc oop | ratio | malloc ip | hostalloc ip "
          "| ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for binary in collectives:
        for size in args.sizes:
            cells = []
            for placement in ("out_of_place", "in_place"):
                a = samples.get((binary, 0, size, placement))
                b = samples.get((binary, 1, size, placement))
                if not a or not b:
                    cells += ["-", "-", "-"]
                    continue
                ma, mb = statistics.median(a), statistics.median(b)
                cells += [f"{ma:.2f}", f"{mb:.2f}", f"{mb / ma:.2f}x"]
            print(f"| {binary} | {size_text(size)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
