#!/usr/bin/env python3
"""Is the tuner's AllReduce pick ever more than 10% slower than the fastest
algorithm? For each world size, launches perf/tuner_sweep LAUNCHES times.
Each launch holds one communicator per configuration (the tuner's, and one
per forced algorithm) and times them interleaved over the size sweep, so an
algorithm is compared with the others under the same machine state; the
machine's speed changes from launch to launch by more than the algorithms
differ. Per size, every launch's times are first divided by that launch's
geometric mean of the forced algorithms' times (which cancels the machine's
speed of the moment); then, over the launches, each algorithm's median of
those normalized times is taken, and

    ratio = median normalized time of the algorithm the tuner picked
            / the lowest median normalized time of any algorithm

(pass: <= 1 + tolerance). Where the tuner picked the shared-memory board
(AllReduce of up to 48 bytes, all ranks on one host), which no algorithm can
be forced to, its own time stands for the pick.

The older statistic, the median over launches of (picked / fastest in that
launch), is printed too ("per-launch"). It is biased against the tuner:
the fastest of four noisy timings is lower than any one of them, so even
among algorithms of equal speed the picked one is "slower" than the minimum
in most launches. Taking the minimum after the medians leaves less of that
bias. "paired" compares the pick with each algorithm launch by launch: per
algorithm, the median over launches of (picked / that algorithm), and the
largest of those; a launch's speed cancels in each ratio.

The verdict's own noise falls with the launches: with 5, runs a few minutes
apart each found one or two sizes over 1.10, never the same ones, all where
two algorithms are within 10% of each other (docs/ALGORITHMS.md).

  perf/tuner_check.py --build build -P 2,3,4 --launches 9 --reps 3 --iters 10
Exits 1 if any size fails.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ALGORITHMS = ["ring", "butterfly", "halving", "dbtree"]


def launch(args, ranks, path):
    env = dict(os.environ)
    env.pop("BRAID_ALGO", None)
    subprocess.run(
        [f"{args.build}/tools/braidrun", "-n", str(ranks), f"{args.build}/perf/tuner_sweep", "-b", args.min,
         "-e", args.max, "-f", str(args.factor), "-n", str(args.iters), "-w", str(args.warmup), "-r", str(args.reps), "-T", str(args.min_time_us), "-J", path],
        stdout=subprocess.DEVNULL, env=env, timeout=1800, check=True)
    with open(path) as f:
        return json.load(f)["rows"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("-P", "--ranks", default="2,3,4")
    p.add_argument("--launches", type=int, default=5)
    p.add_argument("--reps", type=int, default=5, help="interleaved timings per size in one launch")
    p.add_argument("--iters", type=int, default=20, help="calls per timing")
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed calls per configuration and size; with BRAID_TUNE=measure, enough "
                        "for the tuner's trials (37 with 4 candidates) to end before the timings")
    p.add_argument("--min-time-us", type=float, default=2000,
                   help="more calls per timing where --iters calls would take less than this")
    p.add_argument("--min", default="8")
    p.add_argument("--max", default="64M")
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--tolerance", type=float, default=0.10)
    args = p.parse_args()
    failed = 0
    with tempfile.TemporaryDirectory() as scratch:
        for ranks in [int(r) for r in args.ranks.split(",")]:
            per_size = {}
            for i in range(args.launches):
                for row in launch(args, ranks, os.path.join(scratch, f"{ranks}-{i}.json")):
                    entry = per_size.setdefault(row["bytes"], {"us": {}, "picked": set(), "ratio": [],
                                                               "norm": {}, "pick_norm": [],
                                                               "paired": {}})
                    for name, us in row["us"].items():
                        entry["us"].setdefault(name, []).append(us)
                    entry["picked"].add(row["picked"])
                    entry["ratio"].append(row["ratio"])
                    scale = statistics.geometric_mean([row["us"][a] for a in ALGORITHMS])
                    for a in ALGORITHMS:
                        entry["norm"].setdefault(a, []).append(row["us"][a] / scale)
                    picked = row["picked"] if row["picked"] in ALGORITHMS else "tuner"
                    entry["pick_norm"].append(row["us"][picked] / scale)
                    for a in ALGORITHMS:
                        entry["paired"].setdefault(a, []).append(row["us"][picked] / row["us"][a])
            print(f"# {ranks} ranks, {args.launches} launches of {args.reps} interleaved timings of "
                  f"{args.iters} calls or {args.min_time_us:g} us or more: median us per call; ratio of normalized medians, and the per-launch one")
            print(f"{'size':>10} " + " ".join(f"{a:>10}" for a in ALGORITHMS) +
                  f" {'tuner':>10} {'picked':>16} {'ratio':>6} {'per-launch':>10} {'paired':>6}")
            for size in sorted(per_size):
                entry = per_size[size]
                medians = {name: statistics.median(us) for name, us in entry["us"].items()}
                per_launch = statistics.median(entry["ratio"])
                fastest = min(statistics.median(v) for v in entry["norm"].values())
                ratio = statistics.median(entry["pick_norm"]) / fastest
                paired = max(statistics.median(v) for v in entry["paired"].values())
                ok = ratio <= 1 + args.tolerance
                failed += not ok
                print(f"{size:>10} " + " ".join(f"{medians[a]:>10.1f}" for a in ALGORITHMS) +
                      f" {medians['tuner']:>10.1f} {'/'.join(sorted(entry['picked'])):>16} {ratio:>6.2f} {per_launch:>10.2f} {paired:>6.2f}"
                      f"{'' if ok else '  SLOWER'}")
            sys.stdout.flush()
    print(f"{failed} size(s) where the tuner's pick is more than {args.tolerance:.0%} slower than the fastest")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
