#!/usr/bin/env python3
"""Is the tuner's AllReduce pick ever more than 10% slower than the fastest
algorithm? Runs all_reduce_perf over a size sweep with the tuner choosing
(no BRAID_ALGO) and with every AllReduce algorithm forced, interleaved
REPS times, and compares medians per size:

    pick  = median time of the algorithm the tuner picked, run forced
    ratio = pick / median time of the fastest forced algorithm   (pass: <= 1 + tolerance)

The tuner's own run is shown too, but it is one more launch on a machine
whose speed changes from launch to launch, so the verdict compares forced
runs only: it judges the choice, not the noise.

  perf/tuner_check.py --build build -P 2,3,4 --reps 5
Exits 1 if any size fails.
"""
import argparse
import os
import random
import statistics
import subprocess
import sys

ALGORITHMS = ["ring", "butterfly", "halving", "dbtree"]


def sweep(build, ranks, forced, args):
    env = dict(os.environ)
    env.pop("BRAID_ALGO", None)
    if forced:
        env["BRAID_ALGO"] = "allreduce=" + forced
    out = subprocess.run(
        [f"{build}/tools/braidrun", "-n", str(ranks), f"{build}/perf/all_reduce_perf", "-b", args.min,
         "-e", args.max, "-f", str(args.factor), "-n", str(args.iters), "-w", "3", "-c", "0", "-A", "1"],
        capture_output=True, text=True, env=env, timeout=900, check=True).stdout
    rows = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 15 and fields[0] == "[0]" and fields[1].isdigit():
            size = int(fields[1])
            # out-of-place and in-place times; the tuner's pick is the last column
            rows[size] = (min(float(fields[6]), float(fields[10])), fields[-1])
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("-P", "--ranks", default="2,3,4")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--min", default="8")
    p.add_argument("--max", default="64M")
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    failed = 0
    for ranks in [int(r) for r in args.ranks.split(",")]:
        times = {name: {} for name in ["tuner"] + ALGORITHMS}
        picks = {}
        order = ["tuner"] + ALGORITHMS
        for _ in range(args.reps):
            # A fresh order each repetition, so that no configuration always
            # runs right after another (the machine's speed drifts).
            rng.shuffle(order)
            for name in order:
                for size, (t, algorithm) in sweep(args.build, ranks, None if name == "tuner" else name, args).items():
                    times[name].setdefault(size, []).append(t)
                    if name == "tuner":
                        picks.setdefault(size, set()).add(algorithm)
        print(f"# {ranks} ranks, {args.reps} interleaved repetitions, median us per call (best of out-of-place/in-place)")
        print(f"{'size':>10} " + " ".join(f"{a:>10}" for a in ALGORITHMS) + f" {'tuner':>10} {'picked':>16} {'ratio':>6}")
        for size in sorted(times["tuner"]):
            medians = {a: statistics.median(times[a][size]) for a in times}
            best = min(medians[a] for a in ALGORITHMS)
            # A pick that changed between runs (a tie in the model) counts as its worst.
            ratio = max(medians[a] for a in picks[size]) / best
            ok = ratio <= 1 + args.tolerance
            failed += not ok
            print(f"{size:>10} " + " ".join(f"{medians[a]:>10.1f}" for a in ALGORITHMS) +
                  f" {medians['tuner']:>10.1f} {'/'.join(sorted(picks[size])):>16} {ratio:>6.2f}{'' if ok else '  SLOWER'}")
        sys.stdout.flush()
    print(f"{failed} size(s) where the tuner's pick is more than {args.tolerance:.0%} slower than the fastest")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
