#!/usr/bin/env python3
"""PyTorch DDP through the "braid" backend (braid_torch) against gloo.

Two measurements, both on --ranks processes of this machine:

1. A DDP epoch: perf/ddp_reference.py's training (the reference trainer's
   MLP on Fashion-MNIST, Adam, global batch 64, one torch thread per rank),
   launched once per backend and repetition. Launches interleave (braid,
   gloo, then gloo, braid, ...) so that both see the machine alike; each
   braid launch is divided by the gloo launch next to it, and the verdict is
   the median of these ratios against the target (<= 0.6). Epoch time is the
   slowest rank's. "cpu ms/step" adds up the CPU time (user + system, every
   thread) of all ranks per step: the cost of a step that other jobs on the
   machine do not change, unlike its wall time.
2. The same DDP steps in alternating blocks within one launch: each rank
   trains two replicas, one over a braid group and one over a gloo group,
   block by block (a block = --block-steps steps), and the median step time
   per backend. Both backends see the same load at nearly the same time, so
   this one resists a machine whose speed drifts between launches. A third
   replica trains without DDP (no communication at all), and a fourth with
   DDP whose communication hook returns each bucket untouched at once: DDP's
   own work (hooks, bucket copies, futures) without any backend, the floor
   that no backend can go under, and so the best ratio any backend could
   reach.
3. Per-collective latency through the plugin: dist.all_reduce of float32
   tensors, small and large, on a braid group and a gloo group of one
   launch, in alternating blocks; the median block per size and backend.

    /usr/bin/python3 perf/torch_ddp_bench.py --build build --reps 3

Needs Debian's python3-torch and a build with braid_torch
(build/tools/torch).
"""

import argparse
import copy
import os
import resource
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


def cpu_seconds():
    """User + system time of this process, all its threads (braid's and gloo's included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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
    cpu = 0.0
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))
        dist.barrier()
        cpu_start = cpu_seconds()
        start = time.perf_counter()
        for s in range(steps):
            idx = order[s * batch + begin:s * batch + end]
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(x[idx]), y[idx]).backward()
            optimizer.step()
        seconds.append(time.perf_counter() - start)
        cpu += cpu_seconds() - cpu_start
    queue.put({"seconds": seconds, "steps": steps, "cpu_per_step": cpu / (steps * args.epochs)})
    dist.destroy_process_group()


def no_communication(state, bucket):
    """A DDP communication hook that communicates nothing."""
    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def blocks_worker(rank, args, port, queue):
    setup(rank, args, port)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    groups = {"braid": dist.new_group(backend="braid"), "gloo": dist.new_group(backend="gloo")}
    torch.manual_seed(args.seed)
    x, y = ddp_reference.load(args.data, args.train_samples)
    base = ddp_reference.make_model([x.shape[1], 256, 256, 10])
    replicas = {}
    for name, group in groups.items():
        model = DistributedDataParallel(copy.deepcopy(base), process_group=group)
        replicas[name] = (model, torch.optim.Adam(model.parameters(), lr=1e-3))
    alone = copy.deepcopy(base)
    replicas["none"] = (alone, torch.optim.Adam(alone.parameters(), lr=1e-3))
    idle = DistributedDataParallel(copy.deepcopy(base), process_group=groups["gloo"])
    idle.register_comm_hook(None, no_communication)
    replicas["hook"] = (idle, torch.optim.Adam(idle.parameters(), lr=1e-3))
    loss_fn = nn.CrossEntropyLoss()
    batch = args.batch
    begin, end = batch * rank // args.ranks, batch * (rank + 1) // args.ranks
    steps = len(x) // batch
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed))
    names = ["braid", "gloo", "none", "hook"]
    times = {name: [] for name in names}
    cpu = {name: 0.0 for name in names}
    cursor = 0
    for block in range(args.step_blocks):
        for name in (names if block % 2 == 0 else names[::-1]):
            model, optimizer = replicas[name]
            dist.barrier(group=groups["gloo"])
            cpu_start = cpu_seconds()
            start = time.perf_counter()
            for i in range(args.block_steps):
                s = (cursor + i) % steps
                idx = order[s * batch + begin:s * batch + end]
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x[idx]), y[idx]).backward()
                optimizer.step()
            times[name].append((time.perf_counter() - start) / args.block_steps)
            cpu[name] += cpu_seconds() - cpu_start
        cursor += args.block_steps
    steps_run = args.step_blocks * args.block_steps
    queue.put({"times": times, "cpu_per_step": {k: v / steps_run for k, v in cpu.items()}})
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
    queue.put(results)
    dist.destroy_process_group()


def launch(worker, args, *extra):
    """Runs worker on every rank; returns what each rank put, rank 0's first."""
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(worker, args=(args,) + extra + (free_port(), queue), nprocs=args.ranks,
                       start_method="spawn")
    return [queue.get() for _ in range(args.ranks)]


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
    parser.add_argument("--step-blocks", type=int, default=20,
                        help="blocks of DDP steps per backend in the alternating measure")
    parser.add_argument("--block-steps", type=int, default=25, help="DDP steps per block")
    parser.add_argument("--skip-epochs", action="store_true")
    parser.add_argument("--skip-blocks", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()

    print(f"{args.ranks} ranks, torch {torch.__version__}, {os.cpu_count()} cores", flush=True)
    if not args.skip_epochs:
        runs = {"braid": [], "gloo": []}
        cpus = {"braid": [], "gloo": []}
        ratios = []
        for rep in range(args.reps):
            order = ["braid", "gloo"] if rep % 2 == 0 else ["gloo", "braid"]
            pair = {}
            for backend in order:
                results = launch(epoch_worker, args, backend)
                result = results[0]
                # Epoch time: the slowest rank's.
                pair[backend] = max(statistics.median(r["seconds"]) for r in results)
                runs[backend].append(pair[backend])
                cpus[backend].append(sum(r["cpu_per_step"] for r in results))
            ratios.append(pair["braid"] / pair["gloo"])
            print(f"launch {rep + 1}/{args.reps}: braid {pair['braid']:.2f} s, "
                  f"gloo {pair['gloo']:.2f} s, ratio {ratios[-1]:.3f}", flush=True)
        print(f"\nDDP epoch ({result['steps']} steps, MLP 784-256-256-10, Adam, global batch "
              f"{args.batch}, {args.threads} thread(s) per rank)")
        print(f"{'backend':<10}{'median s':>10}{'min s':>10}{'cpu ms/step':>13}")
        for backend in ("braid", "gloo"):
            print(f"{backend:<10}{statistics.median(runs[backend]):>10.3f}"
                  f"{min(runs[backend]):>10.3f}{1e3 * statistics.median(cpus[backend]):>13.2f}")
        ratio = statistics.median(ratios)
        print(f"median ratio braid / gloo: {ratio:.3f} (range {min(ratios):.3f}-"
              f"{max(ratios):.3f}; target <= {TARGET}) {'PASS' if ratio <= TARGET else 'MISS'}")

    if not args.skip_blocks:
        results = launch(blocks_worker, args)
        times = results[0]["times"]
        cpu = {k: sum(r["cpu_per_step"][k] for r in results) for k in times}
        median = {k: statistics.median(v) for k, v in times.items()}
        pairs = [b / g for b, g in zip(times["braid"], times["gloo"])]
        print(f"\nDDP steps in alternating blocks of {args.block_steps}, one launch, "
              f"{args.step_blocks} blocks each")
        print(f"{'backend':<16}{'ms/step':>10}{'cpu ms/step':>13}")
        for k, label in (("braid", "braid"), ("gloo", "gloo"), ("hook", "DDP, no-op hook"),
                         ("none", "no DDP")):
            print(f"{label:<16}{1e3 * median[k]:>10.2f}{1e3 * cpu[k]:>13.2f}")
        floor = [h / g for h, g in zip(times["hook"], times["gloo"])]
        print(f"median ratio of paired blocks braid / gloo: {statistics.median(pairs):.3f} "
              f"(range {min(pairs):.3f}-{max(pairs):.3f}); DDP without communication / gloo: "
              f"{statistics.median(floor):.3f}; no DDP / gloo: {median['none'] / median['gloo']:.3f}")

    if not args.skip_latency:
        results = launch(latency_worker, args)[0]
        print(f"\nall_reduce float32 through the plugin, median of {args.blocks} blocks")
        print(f"{'bytes':>10}{'braid us':>12}{'gloo us':>12}{'ratio':>8}")
        for size, r in results.items():
            print(f"{size:>10}{1e6 * r['braid']:>12.1f}{1e6 * r['gloo']:>12.1f}"
                  f"{r['braid'] / r['gloo']:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
