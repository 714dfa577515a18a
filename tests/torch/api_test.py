#!/usr/bin/env python3
"""The "braid" backend as the default process group, through each init method.

--case work: init_process_group("braid") with --init env|tcp|file, then Work
objects: wait(), is_completed() before and after, get_future() and a chained
then(), many calls in flight at once, and the process group's name.
--case errors: what a user sees when a call is refused (a dtype or op braid
lacks, recv from any source) and when braid itself fails (ranks calling
different counts): a RuntimeError that carries braid's message.
--case teardown: a group destroyed right after a wait(), while the work's
future callback still runs, is no abort: the peers' call completes.

    python3 tests/torch/api_test.py --ranks 2 --init file --case work
"""

import datetime
import threading
import time

import torch
import torch.distributed as dist

import braid_torch
import ranks


def init(rank, world, args, timeout=datetime.timedelta(seconds=60)):
    dist.init_process_group("braid", init_method=ranks.init_method(args), rank=rank,
                            world_size=world, timeout=timeout)
    assert dist.get_backend() == "braid", dist.get_backend()
    assert dist.get_rank() == rank and dist.get_world_size() == world


def expect_error(call, *words):
    try:
        call()
    except RuntimeError as e:
        text = str(e)
        for w in words:
            assert w in text, f"{w!r} not in the error: {text}"
        return text
    raise AssertionError(f"no error; expected one naming {words}")


def work_case(rank, world, args):
    init(rank, world, args)
    assert braid_torch.backend_name == "braid" and braid_torch.braid_version >= 100

    # Rank 0's call cannot finish before the last rank joins, a second later.
    t = torch.full((1000,), float(rank + 1))
    if rank == world - 1:
        time.sleep(1.0)
    work = dist.all_reduce(t, async_op=True)
    if rank == 0 and world > 1:
        assert not work.is_completed(), "completed before every rank called"
    assert work.wait()
    assert work.is_completed()
    total = world * (world + 1) / 2
    assert torch.all(t == total), t

    # The future holds the output and completes chained callbacks.
    t = torch.full((10,), float(rank))
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    assert torch.equal(fut.wait()[0], t)
    assert torch.all(doubled.wait() == 2 * sum(range(world)))

    # A callback chained on a future may wait for another call of the group,
    # itself chained two deep (PyTorch's powerSGD hook does so): futures
    # complete off the thread that runs the group's calls.
    # The last rank joins late, so that the others chain their callbacks
    # before the call ends and see them run off the main thread.
    t = torch.full((4,), float(rank))
    u = torch.full((4,), 1.0)
    v = torch.full((4,), 2.0)
    threads = []

    def all_reduce_in_callback(tensor):
        threads.append(threading.current_thread())
        return dist.all_reduce(tensor, async_op=True).get_future().wait()[0]

    if rank == world - 1:
        time.sleep(0.5)
    first = dist.all_reduce(t, async_op=True).get_future()
    second = first.then(lambda f: f.value()[0] + all_reduce_in_callback(u))
    third = second.then(lambda f: f.value() + all_reduce_in_callback(v))
    assert torch.all(third.wait() == sum(range(world)) + 3 * world), third.wait()
    if rank == 0 and world > 1:
        assert threading.main_thread() not in threads, threads

    # Many calls in flight, completed in order.
    tensors = [torch.full((5000,), float(i + rank)) for i in range(16)]
    works = [dist.all_reduce(x, async_op=True) for x in tensors]
    gathered = [torch.zeros(3) for _ in range(world)]
    works.append(dist.all_gather(gathered, torch.full((3,), float(rank)), async_op=True))
    futures = [w.get_future() for w in works]
    torch.futures.wait_all(futures)
    for i, x in enumerate(tensors):
        assert torch.all(x == world * i + sum(range(world))), (i, x)
    for r in range(world):
        assert torch.all(gathered[r] == r)
    assert all(w.is_completed() for w in works)

    # Non-contiguous tensors are staged and copied back.
    m = torch.arange(12, dtype=torch.float64).reshape(3, 4).t()
    dist.all_reduce(m)
    assert torch.equal(m, world * torch.arange(12, dtype=torch.float64).reshape(3, 4).t())

    # Results copied into the caller's tensors on braid's thread: under
    # inference_mode (evaluation, metrics), and into outputs that require
    # grad, as gloo's raw writes do. The copy ran with the autograd checks
    # of braid's thread and failed ("Inplace update to inference tensor").
    with torch.inference_mode():
        outs = [torch.zeros(3) for _ in range(world)]
        dist.all_gather(outs, torch.full((3,), float(rank)))
        for r in range(world):
            assert torch.all(outs[r] == r), outs
        objects = [None] * world
        dist.all_gather_object(objects, {"rank": rank})
        assert objects == [{"rank": r} for r in range(world)], objects
    outs = [torch.zeros(3, requires_grad=True) for _ in range(world)]
    dist.all_gather(outs, torch.full((3,), float(rank)))
    for r in range(world):
        assert torch.all(outs[r].detach() == r), outs

    # A non-contiguous tensor used by two calls in a row: the second reads
    # the first's result, as with a contiguous one (world**2 here). It read
    # the tensor as it was when the call was made: world.
    m = torch.ones(4, 3).t()
    if rank == world - 1:
        time.sleep(0.5)  # the others queue both calls before the first can end
    w1 = dist.all_reduce(m, async_op=True)
    w2 = dist.all_reduce(m, async_op=True)
    w1.wait()
    w2.wait()
    assert torch.all(m == world * world), m
    parts = [torch.ones(2, 3).t() for _ in range(world)]
    if rank == world - 1:
        time.sleep(0.5)
    work = dist.all_reduce(parts[0], async_op=True)
    out = torch.zeros(3, 2)
    dist.reduce_scatter(out, parts)
    work.wait()
    expected = world * world if rank == 0 else world
    assert torch.all(out == expected), (out, expected)

    # A receive still pending when the group is destroyed (nobody sends it)
    # is aborted, as NCCL's destructor aborts its communicators; the destroy
    # waited for it until the timeout (60 s here, 30 min by default).
    dist.barrier()
    pending = dist.irecv(torch.zeros(3), src=(rank + 1) % world)
    start = time.monotonic()
    dist.destroy_process_group()
    took = time.monotonic() - start
    assert took < 5, f"destroy_process_group took {took:.1f} s"
    expect_error(pending.wait, "braid")
    print(f"rank {rank}: work and futures through {args.init}:// passed", flush=True)


def errors_case(rank, world, args):
    init(rank, world, args, timeout=datetime.timedelta(seconds=20))
    t = torch.ones(10, dtype=torch.int16)
    expect_error(lambda: dist.all_reduce(t), "braid", "Short", "not supported")
    expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=torch.int32), dist.ReduceOp.BAND),
                 "braid", "not supported")
    expect_error(lambda: dist.recv(torch.zeros(3)), "recvAnysource")
    expect_error(lambda: dist.recv(torch.zeros(3), src=world + 5), "recv", "not a rank")
    expect_error(lambda: dist.send(torch.zeros(3), dst=world + 5), "send", "not a rank")
    expect_error(lambda: dist.broadcast(torch.ones(3), src=world + 5), "braid", "root")

    # Even splits cut whole rows of the first dimension, as gloo's: 2 rows
    # per rank and one more divide as elements, not as rows.
    rows = torch.arange(float(2 * world + 1) * world).reshape(2 * world + 1, world)
    expect_error(lambda: dist.all_to_all_single(torch.empty_like(rows), rows), "braid",
                 "first dimension")

    # Refused calls leave the process group usable.
    x = torch.ones(8)
    dist.all_reduce(x)
    assert torch.all(x == world)

    # A timeout longer than braid's longest (1e7 s) is that longest, as an
    # "effectively infinite" timeout; it made the group's creation fail.
    patient = dist.new_group(backend="braid", timeout=datetime.timedelta(days=200))
    x = torch.ones(4)
    dist.all_reduce(x, group=patient)
    assert torch.all(x == world)

    # A failure inside braid: the ranks disagree on the count.
    # wait() raises it, and the Work's future fails with it.
    mine = torch.ones(10 if rank == 0 else 20)
    work = dist.all_reduce(mine, async_op=True)
    future = work.get_future()
    text = expect_error(work.wait, "braid: all_reduce failed", "invalid usage", "count=10",
                        "count=20")
    expect_error(future.wait, "braid: all_reduce failed", "count=10", "count=20")
    assert work.is_completed() and future.done()
    print(f"rank {rank}: {text}", flush=True)
    # The communicator is unusable after it; later calls say so.
    expect_error(lambda: dist.all_reduce(torch.ones(3)), "braid")
    dist.destroy_process_group()


def teardown_case(rank, world, args):
    init(rank, world, args)
    # A group whose last reference a future's callback drops: it is
    # destroyed on the thread that completes its futures, which the destroy
    # must not wait for.
    holder = [dist.new_group(backend="braid")]
    x = torch.ones(3)
    if rank == world - 1:
        time.sleep(0.5)  # the others chain the callback before the call ends
    fut = dist.all_reduce(x, group=holder[0], async_op=True).get_future()
    threads = []
    done = fut.then(lambda _: (threads.append(threading.current_thread()),
                               dist.destroy_process_group(holder[0]), holder.clear()))
    done.wait()
    assert not holder and torch.all(x == world), x
    if rank == 0:
        assert threads != [threading.main_thread()], threads

    # Rank 0's part of a broadcast is done, and wait() returned, while the
    # future's callback still runs (on the group's completion thread); the
    # other ranks are still in the call (the last joins late). Destroying
    # the group then is no abort, which would fail their call.
    t = torch.arange(float(1 << 21)) if rank == 0 else torch.zeros(1 << 21)
    if rank == world - 1:
        time.sleep(0.5)
    work = dist.broadcast(t, 0, async_op=True)
    if rank == 0:
        work.get_future().then(lambda _: time.sleep(1.0))
    work.wait()
    assert torch.equal(t, torch.arange(float(1 << 21))), "broadcast data"
    dist.destroy_process_group()
    print(f"rank {rank}: destroyed after a finished work, its callback running", flush=True)


def body(rank, world, args):
    {"work": work_case, "errors": errors_case, "teardown": teardown_case}[args.case](rank, world,
                                                                                    args)


def extra(parser):
    parser.add_argument("--case", choices=["work", "errors", "teardown"], default="work")


if __name__ == "__main__":
    ranks.main(body, extra)
