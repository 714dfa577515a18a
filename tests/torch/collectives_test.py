#!/usr/bin/env python3
"""Every collective of the "braid" backend against gloo's, on real processes.

Each rank has a gloo process group (the default one) and a braid one made
with new_group(backend="braid"). Each case runs the same call on the same
inputs through both and compares the outputs: exactly for integers and
moved data, to a few ulps for floating-point reductions (the two sum in
different orders). Where gloo lacks the call (reduce_scatter, list
all_to_all, AVG, bfloat16 reductions) the reference is computed from every
rank's inputs, gathered through gloo.

    python3 tests/torch/collectives_test.py --ranks 3
"""

import time

import torch
import torch.distributed as dist

import braid_torch  # noqa: F401  (registers the backend)
import ranks

REDUCING_TYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.float16,
                  torch.bfloat16, torch.int8, torch.uint8]
MOVED_TYPES = REDUCING_TYPES + [torch.bool, torch.int16, torch.complex64]
# What gloo handles at all; the other types get references made from the
# ranks' deterministic inputs.
GLOO_TYPES = {torch.float32, torch.float64, torch.int32, torch.int64, torch.float16,
              torch.int8, torch.uint8}
OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


class Checker:
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self.braid = dist.new_group(backend="braid")
        self.gloo = dist.new_group(backend="gloo")
        self.cases = 0

    def inputs(self, dtype, shape, seed, rank=None):
        """Rank `rank`'s input of a case (deterministic, so any rank can make it)."""
        g = torch.Generator().manual_seed(seed * 100 + (self.rank if rank is None else rank))
        if dtype.is_floating_point or dtype.is_complex:
            # Products of many values stay in range; a few ranks only.
            x = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
            return x.to(dtype)
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=g).bool()
        low, high = (0, 4) if dtype in (torch.uint8, torch.int8) else (-50, 50)
        return torch.randint(low, high, shape, generator=g).to(dtype)

    def expect_equal(self, got, want, what):
        self.cases += 1
        assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, want {want.dtype}"
        assert got.shape == want.shape, f"{what}: shape {got.shape}, want {want.shape}"
        if got.dtype.is_floating_point:
            tol = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1e-6,
                   torch.float64: 1e-12}[got.dtype]
            ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
        else:
            ok = torch.equal(got, want)
        assert ok, f"rank {self.rank}: {what}: braid {got} != reference {want}"

    def all_inputs(self, dtype, shape, seed):
        return [self.inputs(dtype, shape, seed, r) for r in range(self.world)]

    @staticmethod
    def reduce_local(parts, op):
        """What a reduction over ranks gives, computed in the parts' dtype as braid does."""
        wide = torch.float32 if parts[0].dtype in (torch.float16, torch.bfloat16) else None
        acc = parts[0].clone()
        for p in parts[1:]:
            if op == "sum" or op == "avg":
                acc = (acc.to(wide) + p.to(wide)).to(p.dtype) if wide else acc + p
            elif op == "product":
                acc = (acc.to(wide) * p.to(wide)).to(p.dtype) if wide else acc * p
            elif op == "min":
                acc = torch.minimum(acc, p)
            else:
                acc = torch.maximum(acc, p)
        if op == "avg":
            n = len(parts)
            acc = torch.div(acc, n, rounding_mode="trunc") if not acc.dtype.is_floating_point \
                else (acc.to(wide) / n).to(acc.dtype) if wide else acc / n
        return acc

    def allreduce(self):
        seed = 0
        for dtype in REDUCING_TYPES:
            for op in OPS:
                for count in (1, 1000, 70001):
                    seed += 1
                    x = self.inputs(dtype, (count,), seed)
                    got = x.clone()
                    dist.all_reduce(got, OPS[op], group=self.braid)
                    if dtype in GLOO_TYPES and op != "avg":
                        want = x.clone()
                        dist.all_reduce(want, OPS[op], group=self.gloo)
                    else:
                        want = self.reduce_local(self.all_inputs(dtype, (count,), seed), op)
                    self.expect_equal(got, want, f"all_reduce {dtype} {op} count={count}")

    def broadcast_and_reduce(self):
        for dtype in MOVED_TYPES:
            for root in range(self.world):
                x = self.inputs(dtype, (33, 7), 7 + root)
                got, want = x.clone(), x.clone()
                dist.broadcast(got, root, group=self.braid)
                if dtype in GLOO_TYPES:
                    dist.broadcast(want, root, group=self.gloo)
                else:
                    want = self.inputs(dtype, (33, 7), 7 + root, root)
                self.expect_equal(got, want, f"broadcast {dtype} root={root}")
        for dtype in (torch.float32, torch.int64, torch.float64):
            for op in ("sum", "max"):
                for root in range(self.world):
                    x = self.inputs(dtype, (5000,), 11 + root)
                    got, want = x.clone(), x.clone()
                    dist.reduce(got, root, OPS[op], group=self.braid)
                    dist.reduce(want, root, OPS[op], group=self.gloo)
                    if self.rank == root:
                        self.expect_equal(got, want, f"reduce {dtype} {op} root={root}")

    def gathers(self):
        n = self.world
        for dtype in MOVED_TYPES:
            x = self.inputs(dtype, (10, 3), 21)
            got = [torch.zeros_like(x) for _ in range(n)]
            want = [torch.zeros_like(x) for _ in range(n)]
            dist.all_gather(got, x, group=self.braid)
            if dtype in GLOO_TYPES:
                dist.all_gather(want, x, group=self.gloo)
            else:
                want = self.all_inputs(dtype, (10, 3), 21)
            for r in range(n):
                self.expect_equal(got[r], want[r], f"all_gather {dtype} part {r}")

            # gloo has no _allgather_base: its all_gather's parts, concatenated.
            flat_got = torch.zeros((n * 10, 3), dtype=dtype)
            dist.all_gather_into_tensor(flat_got, x, group=self.braid)
            flat_want = torch.cat(want)
            self.expect_equal(flat_got, flat_want, f"_all_gather_base {dtype}")

            for root in range(n):
                got = [torch.zeros_like(x) for _ in range(n)] if self.rank == root else None
                want = [torch.zeros_like(x) for _ in range(n)] if self.rank == root else None
                dist.gather(x, got, dst=root, group=self.braid)
                if dtype in GLOO_TYPES:
                    dist.gather(x, want, dst=root, group=self.gloo)
                elif self.rank == root:
                    want = self.all_inputs(dtype, (10, 3), 21)
                if self.rank == root:
                    for r in range(n):
                        self.expect_equal(got[r], want[r], f"gather {dtype} root={root} part {r}")

                parts = [self.inputs(dtype, (4, 5), 31 + r) for r in range(n)]
                got, want = torch.zeros((4, 5), dtype=dtype), torch.zeros((4, 5), dtype=dtype)
                dist.scatter(got, parts if self.rank == root else None, src=root,
                             group=self.braid)
                if dtype in GLOO_TYPES:
                    dist.scatter(want, parts if self.rank == root else None, src=root,
                                 group=self.gloo)
                else:
                    want = self.inputs(dtype, (4, 5), 31 + self.rank, root)
                self.expect_equal(got, want, f"scatter {dtype} root={root}")

    def reduce_scatters(self):
        n = self.world
        for dtype in (torch.float32, torch.int64, torch.float64, torch.bfloat16):
            for op in ("sum", "min", "avg"):
                seed = 41
                parts = [self.inputs(dtype, (123,), seed * 10 + r) for r in range(n)]
                got = torch.zeros(123, dtype=dtype)
                dist.reduce_scatter(got, parts, OPS[op], group=self.braid)
                # Rank r's part j is inputs(seed*10 + j, rank r); the result
                # is the reduction of everyone's part `self.rank`.
                every = [self.inputs(dtype, (123,), seed * 10 + self.rank, r) for r in range(n)]
                want = self.reduce_local(every, op)
                if dtype in GLOO_TYPES and op != "avg":
                    # gloo has no reduce_scatter: its all_reduce, then our part.
                    stacked = torch.stack(parts)
                    dist.all_reduce(stacked, OPS[op], group=self.gloo)
                    want = stacked[self.rank].clone()
                self.expect_equal(got, want, f"reduce_scatter {dtype} {op}")

                flat = torch.cat(parts)
                got = torch.zeros(123, dtype=dtype)
                dist.reduce_scatter_tensor(got, flat, OPS[op], group=self.braid)
                self.expect_equal(got, want, f"_reduce_scatter_base {dtype} {op}")

    def alltoalls(self):
        n = self.world
        for dtype in (torch.float32, torch.int64, torch.uint8, torch.bool):
            x = self.inputs(dtype, (n * 6, 2), 51)
            got, want = torch.zeros_like(x), torch.zeros_like(x)
            dist.all_to_all_single(got, x, group=self.braid)
            if dtype in GLOO_TYPES:
                dist.all_to_all_single(want, x, group=self.gloo)
            else:
                want = torch.cat([self.inputs(dtype, (n * 6, 2), 51, p)[6 * self.rank:
                                                                         6 * self.rank + 6]
                                  for p in range(n)])
            self.expect_equal(got, want, f"all_to_all_single {dtype} even")

            # Uneven: rank r sends r + p + 1 rows to rank p.
            send = [self.rank + p + 1 for p in range(n)]
            recv = [p + self.rank + 1 for p in range(n)]
            x = self.inputs(dtype, (sum(send), 3), 61)
            got = torch.zeros((sum(recv), 3), dtype=dtype)
            want = torch.zeros((sum(recv), 3), dtype=dtype)
            dist.all_to_all_single(got, x, recv, send, group=self.braid)
            if dtype in GLOO_TYPES:
                dist.all_to_all_single(want, x, recv, send, group=self.gloo)
            else:
                # Rank p's rows for this rank start after its rows for lower ranks.
                want = torch.cat([
                    self.inputs(dtype, (sum(p + q + 1 for q in range(n)), 3), 61, p)[
                        sum(p + q + 1 for q in range(self.rank)):][:p + self.rank + 1]
                    for p in range(n)])
            self.expect_equal(got, want, f"all_to_all_single {dtype} uneven")

            # The list form, uneven too; gloo lacks it, so the reference is
            # made from the senders' deterministic inputs.
            ins = [self.inputs(dtype, (send[p], 2), 71 + p) for p in range(n)]
            outs = [torch.zeros((recv[p], 2), dtype=dtype) for p in range(n)]
            dist.all_to_all(outs, ins, group=self.braid)
            for p in range(n):
                want = self.inputs(dtype, (recv[p], 2), 71 + self.rank, p)
                self.expect_equal(outs[p], want, f"all_to_all {dtype} from {p}")

    def point_to_point(self):
        n = self.world
        if n < 2:
            return
        nxt, prev = (self.rank + 1) % n, (self.rank - 1) % n
        for count in (1, 100, 300000):
            x = self.inputs(torch.float32, (count,), 81)
            got = torch.zeros(count)
            # Even ranks send first, odd ranks receive first: blocking calls
            # that pair up without a group.
            if self.rank % 2 == 0:
                dist.send(x, nxt, group=self.braid)
                dist.recv(got, prev, group=self.braid)
            else:
                dist.recv(got, prev, group=self.braid)
                dist.send(x, nxt, group=self.braid)
            want = self.inputs(torch.float32, (count,), 81, prev)
            self.expect_equal(got, want, f"send/recv ring count={count}")
            # Both directions at once through batch_isend_irecv (one group).
            got = torch.zeros(count)
            ops = [dist.P2POp(dist.isend, x, nxt, group=self.braid),
                   dist.P2POp(dist.irecv, got, prev, group=self.braid)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            self.expect_equal(got, want, f"batch_isend_irecv count={count}")
        # Without a group: a receive from one rank still pending holds up no
        # send to another, whatever the size (8 MB is far beyond braid's
        # buffers), as with gloo. Every rank posts irecv, then isend; then
        # the ring of PyTorch's tutorial: isend, then a blocking recv.
        for count in (100, 2000000):
            x = self.inputs(torch.float32, (count,), 83)
            want = self.inputs(torch.float32, (count,), 83, prev)
            got = torch.zeros(count)
            r = dist.irecv(got, prev, group=self.braid)
            s = dist.isend(x, nxt, group=self.braid)
            r.wait()
            s.wait()
            self.expect_equal(got, want, f"irecv then isend ring count={count}")
            got = torch.zeros(count)
            s = dist.isend(x, nxt, group=self.braid)
            dist.recv(got, prev, group=self.braid)
            s.wait()
            self.expect_equal(got, want, f"isend then recv ring count={count}")
            # Both ways at once: each rank receives from both neighbours,
            # then sends to both; between two ranks, in the order sent.
            from_prev, from_next = torch.zeros(count), torch.zeros(count)
            y = self.inputs(torch.float32, (count,), 84)
            works = [dist.irecv(from_prev, prev, group=self.braid),
                     dist.irecv(from_next, nxt, group=self.braid),
                     dist.isend(x, nxt, group=self.braid),
                     dist.isend(y, prev, group=self.braid)]
            for w in works:
                w.wait()
            self.expect_equal(from_prev, want, f"two-way ring from the previous rank count={count}")
            # (Of two ranks, the neighbours are one rank, whose two messages
            # arrive in the order sent: x, then y.)
            self.expect_equal(from_next, self.inputs(torch.float32, (count,), 84, nxt),
                              f"two-way ring from the next rank count={count}")

        # A send still pending to one rank holds up no send to another: rank
        # 0 sends a large message to rank 1, busy elsewhere for a while, then
        # a small one to rank 2, which gets it at once.
        if n >= 3:
            count = 2000000
            busy_seconds = 1.5
            dist.barrier(group=self.braid)
            if self.rank == 0:
                large = self.inputs(torch.float32, (count,), 85)
                works = [dist.isend(large, 1, group=self.braid),
                         dist.isend(torch.full((4,), 7.0), 2, group=self.braid)]
                for w in works:
                    w.wait()
            elif self.rank == 1:
                time.sleep(busy_seconds)
                got = torch.zeros(count)
                dist.recv(got, 0, group=self.braid)
                self.expect_equal(got, self.inputs(torch.float32, (count,), 85, 0),
                                  "a large send taken late")
            elif self.rank == 2:
                word = torch.zeros(4)
                start = time.monotonic()
                dist.recv(word, 0, group=self.braid)
                waited = time.monotonic() - start
                self.expect_equal(word, torch.full((4,), 7.0), "a small send after a large one")
                if waited > busy_seconds / 2:
                    raise AssertionError(
                        f"rank 2 waited {waited:.2f} s for a small send queued behind a large "
                        f"one to a rank busy for {busy_seconds} s")
            dist.barrier(group=self.braid)

    def subgroups(self):
        # Groups of some ranks, numbered within the group, next to the whole.
        n = self.world
        ends = dist.new_group([0, n - 1], backend="braid")
        rest = dist.new_group(list(range(1, n)), backend="braid")
        x = torch.full((7,), float(self.rank + 1))
        if self.rank in (0, n - 1):
            dist.all_reduce(x, group=ends)
            self.expect_equal(x, torch.full((7,), float(1 + n if n > 1 else 1)), "ends group")
        x = torch.full((7,), float(self.rank + 1))
        if self.rank >= 1:
            dist.broadcast(x, src=n - 1, group=rest)
            self.expect_equal(x, torch.full((7,), float(n)), "rest group broadcast")
        dist.barrier(group=self.braid)

    def barrier(self):
        for _ in range(3):
            dist.barrier(group=self.braid)
        self.cases += 1


def body(rank, world, args):
    dist.init_process_group("gloo", rank=rank, world_size=world)
    checker = Checker(rank, world)
    for case in args.case.split(","):
        getattr(checker, case)()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank}: {checker.cases} comparisons passed", flush=True)


def extra(parser):
    parser.add_argument("--case", default="allreduce,broadcast_and_reduce,gathers,"
                        "reduce_scatters,alltoalls,point_to_point,subgroups,barrier")


if __name__ == "__main__":
    ranks.main(body, extra)
