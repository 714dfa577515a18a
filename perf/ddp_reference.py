#!/usr/bin/env python3
"""PyTorch DistributedDataParallel counterpart of braid-train, for speed comparisons.

The same MLP (784-256-256-10 by default, ReLU, softmax cross-entropy), the same
optimizer and hyper-parameters, the same global batch split the same way over
the ranks (rank r takes samples [r*B/N, (r+1)*B/N) of each global batch), the
data held in memory as tensors (no DataLoader), gloo for the collectives.

Epoch time counts the training steps only, as braid-train's does. After the
timed epochs, the share of step time spent communicating is measured by
timing blocks of ordinary DDP steps against blocks of the same steps under
`no_sync()` (which skips the gradient AllReduce): 1 - (median no_sync step) /
(median DDP step) is the communication that the backward pass did not hide.
Blocks alternate so that drift in the machine's speed affects both alike.

    python3 perf/ddp_reference.py --ranks 2 --epochs 2 --json

Needs Debian's python3-torch (and numpy).
"""

import argparse
import gzip
import json
import math
import os
import socket
import statistics
import struct
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530


def read_idx(path):
    with gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def locate(directory, name):
    path = os.path.join(directory, name)
    return path + ".gz" if os.path.exists(path + ".gz") else path


def load(directory, limit):
    images = read_idx(locate(directory, "train-images-idx3-ubyte"))
    labels = read_idx(locate(directory, "train-labels-idx1-ubyte"))
    if limit:
        images, labels = images[:limit], labels[:limit]
    x = torch.from_numpy(images.reshape(len(images), -1).astype(np.float32))
    x = (x / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return x, torch.from_numpy(labels.astype(np.int64))


def make_model(sizes):
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i + 2 < len(sizes):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def worker(rank, args, port, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    torch.manual_seed(args.seed)

    x, y = load(args.data, args.train_samples)
    sizes = [x.shape[1]] + [int(w) for w in args.hidden.split(",") if w] + [10]
    model = DistributedDataParallel(make_model(sizes), bucket_cap_mb=args.bucket_mb)
    base_lr = args.lr or (1e-3 if args.optimizer == "adam" else 0.02)
    if args.optimizer == "adam":
        optimizer = torch.optim.Adam(model.parameters(), lr=base_lr)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9)
    # Summed here and scaled by ranks / batch: DDP averages the ranks'
    # gradients, so each step's is the sum over the global batch divided by
    # it, as braid-train's, also where the batch does not divide evenly (a
    # mean per rank would weigh a rank's samples by its share's size).
    loss_fn = nn.CrossEntropyLoss(reduction="sum")

    batch = args.batch
    begin = batch * rank // args.ranks
    end = batch * (rank + 1) // args.ranks
    steps = len(x) // batch
    total_steps = steps * args.epochs
    taken = 0

    def step(xb, yb):
        nonlocal taken
        if args.schedule == "cosine":
            # braid-train's schedule: from the base rate down to 0 at the last step.
            rate = base_lr * 0.5 * (1 + math.cos(math.pi * min(taken, total_steps) / total_steps))
            for group in optimizer.param_groups:
                group["lr"] = rate
        taken += 1
        optimizer.zero_grad(set_to_none=True)
        summed = loss_fn(model(xb), yb)
        (summed * (args.ranks / batch)).backward()
        optimizer.step()
        return summed / len(yb)

    epochs = []
    for epoch in range(args.epochs):
        generator = torch.Generator().manual_seed(args.seed * 1000 + epoch)
        order = torch.randperm(len(x), generator=generator)
        dist.barrier()
        start = time.perf_counter()
        loss_sum = 0.0
        for s in range(steps):
            idx = order[s * batch + begin:s * batch + end]
            loss_sum += step(x[idx], y[idx]).item()
        seconds = time.perf_counter() - start
        epochs.append({"epoch": epoch + 1, "seconds": seconds, "loss": loss_sum / steps})

    # Communication share: alternate blocks of DDP steps and no_sync steps;
    # the median block of each kind resists pauses caused by other jobs.
    block = max(1, args.share_steps // args.share_blocks)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed))
    times = {"sync": [], "no_sync": []}
    cursor = 0
    for _ in range(args.share_blocks):
        for mode in ("sync", "no_sync"):
            dist.barrier()
            start = time.perf_counter()
            for _ in range(block):
                s = cursor % steps
                cursor += 1
                idx = order[s * batch + begin:s * batch + end]
                if mode == "sync":
                    step(x[idx], y[idx])
                else:
                    with model.no_sync():
                        step(x[idx], y[idx])
            times[mode].append((time.perf_counter() - start) / block)
    per_sync = statistics.median(times["sync"])
    per_local = statistics.median(times["no_sync"])
    if rank == 0:
        queue.put({
            "ranks": args.ranks,
            "threads_per_rank": args.threads,
            "batch": batch,
            "sizes": sizes,
            "optimizer": args.optimizer,
            "steps_per_epoch": steps,
            "epochs": epochs,
            "step_seconds_ddp": per_sync,
            "step_seconds_no_sync": per_local,
            "communication_share": max(0.0, (per_sync - per_local) / per_sync),
            "torch": torch.__version__,
        })
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="global batch size")
    parser.add_argument("--hidden", default="256,256")
    parser.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    parser.add_argument("--lr", type=float, default=0.0, help="0: 0.001 for adam, 0.02 for sgd")
    parser.add_argument("--schedule", choices=["cosine", "constant"], default="cosine")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads per rank (braid-train's default is 1 BLAS thread)")
    parser.add_argument("--bucket-mb", type=float, default=25.0,
                        help="DDP bucket_cap_mb (25 is DDP's default)")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--train-samples", type=int, default=0)
    parser.add_argument("--share-steps", type=int, default=400,
                        help="steps of each kind for the communication share")
    parser.add_argument("--share-blocks", type=int, default=20,
                        help="blocks of each kind, alternating")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args()

    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(worker, args=(args, free_port(), queue), nprocs=args.ranks,
                       start_method="spawn")
    result = queue.get()
    if args.json:
        print(json.dumps(result))
    else:
        for e in result["epochs"]:
            print(f"epoch {e['epoch']}: {e['seconds']:.2f} s, loss {e['loss']:.4f}")
        print(f"communication share {100 * result['communication_share']:.1f}% "
              f"(step {1e3 * result['step_seconds_ddp']:.2f} ms with DDP, "
              f"{1e3 * result['step_seconds_no_sync']:.2f} ms under no_sync)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
