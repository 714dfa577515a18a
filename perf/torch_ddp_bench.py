#!/usr/bin/env python3
"""PyTorch DDP through the "braid" backend (braid_torch) against gloo.

Two measurements, both on --ranks processes of this machine:

1. A DDP epoch: perf/ddp_reference.py's training (the reference trainer's
   MLP on Fashion-MNIST, Adam, global batch 64, one torch thread per rank),
   launched once per backend and repetition. Launches interleave (braid,
   gloo, then gloo, braid, ...) so that both see the machine alike; each
   braid launch is divided by the gloo launch next to it, and the verdict is
   the median of these ratios against the target (<= 0.6).
2. Per-collective latency through the plugin: dist.all_reduce of float32
   tensors, small and large, on a braid group and a gloo group of one
   launch, in alternating blocks; the median block per size and backend.

    /usr/bin/python3 perf/torch_ddp_bench.py --build build --reps 3

Needs Debian's python3-torch and a build with braid_torch
(build/tools/torch).
"""

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddp_reference  # noqa: E402  (the same model and data loading)

TARGET = 0.6


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(rank, args, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    sys.path.insert(0, os.path.join(os.path.abspath(args.build), "tools", "torch"))
    import braid_torch  # noqa: F401  (registers "braid")
    torch.set_num_threads(args.threads)
    torch.set_num_interop_threads(1)


def epoch_worker(rank, args, backend, port, queue):
    setup(rank, args, port)
    dist.init_process_group(backend, rank=rank, world_size=args.ranks)
    torch.manual_seed(args.seed)
    x, y = ddp_reference.load(args.data, args.train_samples)
    model = DistributedDataParallel(ddp_reference.make_model([x.shape[1], 256, 256, 10]))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    batch = args.batch
    begin, end = batch * rank // args.ranks, batch * (rank + 1) // args.ranks
    steps = len(x) // batch
    seconds = []
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        dist.barrier()
        start = time.perf_counter()
        for s in range(steps):
            idx = order[s * batch + begin:s * batch + end]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x[idx]), y[idx]).backward()
            optimizer.step()
        seconds.append(time.perf_counter() - start)
    if rank == 0:
        queue.put({"seconds": seconds, "steps": steps})
    dist.destroy_process_group()


def latency_worker(rank, args, port, queue):
    setup(rank, args, port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    groups = {"braid": dist.new_group(backend="braid"), "gloo": dist.new_group(backend="gloo")}
    results = {}
    for size in args.sizes:
        tensor = torch.ones(max(1, size // 4))
        iters = 2000 if size <= 65536 else max(5, (64 << 20) // size)
        blocks = {"braid": [], "gloo": []}
        for block in range(args.blocks):
            names = ["braid", "gloo"] if block % 2 == 0 else ["gloo", "braid"]
            for name in names:
                group = groups[name]
                dist.all_reduce(tensor, group=group)  # warm
                dist.barrier(group=groups["gloo"])
                start = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(tensor, group=group)
                blocks[name].append((time.perf_counter() - start) / iters)
        results[size] = {name: statistics.median(v) for name, v in blocks.items()}
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def launch(worker, args, *extra):
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(worker, args=(args,) + extra + (free_port(), queue), nprocs=args.ranks,
                       start_method="spawn")
    return queue.get()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build", help="meson build directory")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3, help="epoch launches per backend")
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per launch")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--train-samples", type=int, default=0)
    parser.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")],
                        default=[8, 4096, 1 << 20, 16 << 20],
                        help="all_reduce sizes in bytes (float32)")
    parser.add_argument("--blocks", type=int, default=6, help="latency blocks per backend")
    parser.add_argument("--skip-epochs", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()

    print(f"{args.ranks} ranks, torch {torch.__version__}, {os.cpu_count()} cores", flush=True)
    if not args.skip_epochs:
        runs = {"braid": [], "gloo": []}
        ratios = []
        for rep in range(args.reps):
            order = ["braid", "gloo"] if rep % 2 == 0 else ["gloo", "braid"]
            pair = {}
            for backend in order:
                result = launch(epoch_worker, args, backend)
                pair[backend] = statistics.median(result["seconds"])
                runs[backend].append(pair[backend])
            ratios.append(pair["braid"] / pair["gloo"])
            print(f"launch {rep + 1}/{args.reps}: braid {pair['braid']:.2f} s, "
                  f"gloo {pair['gloo']:.2f} s, ratio {ratios[-1]:.3f}", flush=True)
        print(f"\nDDP epoch ({result['steps']} steps, MLP 784-256-256-10, Adam, global batch "
              f"{args.batch}, {args.threads} thread(s) per rank)")
        print(f"{'backend':<10}{'median s':>10}{'min s':>10}")
        for backend in ("braid", "gloo"):
            print(f"{backend:<10}{statistics.median(runs[backend]):>10.3f}"
                  f"{min(runs[backend]):>10.3f}")
        ratio = statistics.median(ratios)
        print(f"median ratio braid / gloo: {ratio:.3f} (range {min(ratios):.3f}-"
              f"{max(ratios):.3f}; target <= {TARGET}) {'PASS' if ratio <= TARGET else 'MISS'}")

    if not args.skip_latency:
        results = launch(latency_worker, args)
        print(f"\nall_reduce float32 through the plugin, median of {args.blocks} blocks")
        print(f"{'bytes':>10}{'braid us':>12}{'gloo us':>12}{'ratio':>8}")
        for size, r in results.items():
            print(f"{size:>10}{1e6 * r['braid']:>12.1f}{1e6 * r['gloo']:>12.1f}"
                  f"{r['braid'] / r['gloo']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
