#!/usr/bin/env python3
"""DDP through "braid" ends with the same weights as DDP through gloo.

The reference trainer's MLP (784-256-256-10, ReLU; docs/TRAINER.md,
perf/ddp_reference.py), Adam, 50 steps of a global batch of 64 split over
the ranks, on fixed random data (the training itself, not the data, is under
test). Each rank trains two replicas from the same initial weights, one
wrapped in DDP over a braid process group and one over a gloo group, on the
same batches; afterwards every weight must agree to fp32 rounding: the two
backends may sum the gradients in different orders.

With --hook powersgd both replicas compress their gradients with PyTorch's
powerSGD hook, whose future callbacks wait for further all_reduce calls.

    python3 tests/torch/ddp_test.py --ranks 2
"""

import copy
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powerSGD
from torch.nn.parallel import DistributedDataParallel

import braid_torch  # noqa: F401  (registers the backend)
import ranks

# The model of perf/ddp_reference.py, which the DDP benchmarks train.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf"))
from ddp_reference import make_model  # noqa: E402

STEPS = 50
BATCH = 64


def body(rank, world, args):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    braid = dist.new_group(backend="braid")
    gloo = dist.new_group(backend="gloo")

    torch.manual_seed(1)
    x = torch.randn(STEPS * BATCH, 784)
    y = torch.randint(0, 10, (STEPS * BATCH,))
    # Different initial weights per rank: DDP's broadcast from rank 0 must
    # make them equal.
    torch.manual_seed(100 + rank)
    base = make_model([784, 256, 256, 10])
    replicas = {}
    for name, group in (("braid", braid), ("gloo", gloo)):
        # Under powerSGD, buckets of 0.25 MB (DDP's first is larger), so
        # several: the callbacks of each make calls, which every rank must
        # queue in the same order.
        model = DistributedDataParallel(copy.deepcopy(base), process_group=group,
                                        bucket_cap_mb=0.25 if args.hook == "powersgd" else 25)
        if args.hook == "powersgd":
            # Plain all_reduce for the first 2 steps, then rank-1 compression
            # of the weight matrices.
            state = powerSGD.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                           start_powerSGD_iter=2, min_compression_rate=1)
            model.register_comm_hook(state, powerSGD.powerSGD_hook)
        replicas[name] = (model, torch.optim.Adam(model.parameters(), lr=1e-3))
    loss_fn = nn.CrossEntropyLoss()
    begin, end = BATCH * rank // world, BATCH * (rank + 1) // world
    for step in range(STEPS):
        xb = x[step * BATCH + begin:step * BATCH + end]
        yb = y[step * BATCH + begin:step * BATCH + end]
        for model, optimizer in replicas.values():
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(xb), yb).backward()
            optimizer.step()

    worst = 0.0
    moved = 0.0
    for (name, pb), (_, pg), p0 in zip(replicas["braid"][0].module.named_parameters(),
                                       replicas["gloo"][0].module.named_parameters(),
                                       base.parameters()):
        scale = max(1.0, pg.detach().abs().max().item())
        diff = (pb.detach() - pg.detach()).abs().max().item() / scale
        worst = max(worst, diff)
        moved = max(moved, (pg.detach() - p0.detach()).abs().max().item())
        assert diff <= 1e-5, f"rank {rank}: {name} differs by {diff:.3g} (relative)"
    assert moved > 1e-3, "the weights did not train"
    # Every rank holds the same weights.
    flat = torch.cat([p.detach().reshape(-1) for p in replicas["braid"][0].parameters()])
    first = flat.clone()
    dist.broadcast(first, 0, group=gloo)
    assert torch.equal(flat, first), f"rank {rank}'s braid replica differs from rank 0's"
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {STEPS} DDP steps ({args.hook} hook), braid vs gloo: max relative weight difference "
          f"{worst:.3g}", flush=True)


if __name__ == "__main__":
    ranks.main(body, lambda p: p.add_argument("--hook", choices=["none", "powersgd"],
                                              default="none"))
