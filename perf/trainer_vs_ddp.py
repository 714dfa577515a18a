#!/usr/bin/env python3
"""braid-train against PyTorch DistributedDataParallel: epoch time and communication share.

Both train the same MLP with the same optimizer, global batch and threads per
rank on the same number of local ranks (perf/ddp_reference.py is the PyTorch
side). Launches alternate, braid-train then PyTorch, --reps times, because
the speed of a shared machine drifts between launches; the figures are
medians over every epoch of every launch.

Communication share:
  braid-train: the time its compute thread waited for communication (the
    part of the gradient exchange that the backward pass did not hide),
    divided by the epoch time; braid-train measures it and writes it in its
    CSV log (communication_seconds / epoch_seconds).
  PyTorch: 1 - (step time under no_sync) / (step time with DDP), from
    alternating blocks of both kinds of step (see perf/ddp_reference.py).

    python3 perf/trainer_vs_ddp.py --build build --reps 5

Needs a build with braid-train (OpenBLAS, zlib), Fashion-MNIST
(dataset-fashion-mnist) and PyTorch (python3-torch).
"""

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run_braid(args, log_path):
    command = [os.path.join(args.build, "tools", "braidrun"), "-n", str(args.ranks),
               os.path.join(args.build, "tools", "trainer", "braid-train"),
               "--epochs", str(args.epochs), "--batch", str(args.batch),
               "--optimizer", args.optimizer, "--threads", str(args.threads),
               "--data", args.data, "--progress", "none", "--log", log_path] + args.braid_args
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    with open(log_path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [{"seconds": float(r["epoch_seconds"]),
             "communication": float(r["communication_seconds"]),
             "test_accuracy": float(r["test_accuracy"])} for r in rows]


def run_torch(args):
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_reference.py")
    command = [args.python, script, "--ranks", str(args.ranks), "--epochs", str(args.epochs),
               "--batch", str(args.batch), "--optimizer", args.optimizer,
               "--threads", str(args.threads), "--data", args.data, "--json"]
    out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build", help="meson build directory")
    parser.add_argument("--reps", type=int, default=5, help="launches of each, interleaved")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per launch")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    parser.add_argument("--threads", type=int, default=1, help="BLAS / torch threads per rank")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that has torch (default: this one)")
    parser.add_argument("--braid-args", default="",
                        help="extra braid-train flags, e.g. '--compress fp32'")
    args = parser.parse_args()
    args.braid_args = args.braid_args.split()

    braid_epochs, torch_epochs, torch_shares, accuracies = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            braid = run_braid(args, os.path.join(tmp, f"log{rep}.csv"))
            torch = run_torch(args)
            braid_epochs += braid
            torch_epochs += torch["epochs"]
            torch_shares.append(torch["communication_share"])
            accuracies.append(braid[-1]["test_accuracy"])
            print(f"launch {rep + 1}/{args.reps}: braid-train "
                  + " ".join(f"{e['seconds']:.2f}" for e in braid) + " s, PyTorch DDP "
                  + " ".join(f"{e['seconds']:.2f}" for e in torch["epochs"])
                  + f" s (communication share {100 * torch['communication_share']:.1f}%)",
                  flush=True)

    braid_median = statistics.median(e["seconds"] for e in braid_epochs)
    torch_median = statistics.median(e["seconds"] for e in torch_epochs)
    braid_share = statistics.median(e["communication"] / e["seconds"] for e in braid_epochs)
    torch_share = statistics.median(torch_shares)
    print()
    print(f"{args.ranks} ranks, MLP {torch['sizes']}, {args.optimizer}, global batch {args.batch}, "
          f"{args.threads} thread(s) per rank, {torch['steps_per_epoch']} steps per epoch, "
          f"PyTorch {torch['torch']}")
    print(f"{'':24}{'epoch s (median)':>18}{'min':>8}{'comm share':>12}")
    print(f"{'braid-train':24}{braid_median:>18.3f}"
          f"{min(e['seconds'] for e in braid_epochs):>8.3f}{100 * braid_share:>11.1f}%")
    print(f"{'PyTorch DDP (gloo)':24}{torch_median:>18.3f}"
          f"{min(e['seconds'] for e in torch_epochs):>8.3f}{100 * torch_share:>11.1f}%")
    print(f"ratio braid-train / PyTorch: {braid_median / torch_median:.3f} (target <= 0.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
