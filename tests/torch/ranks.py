"""Runs a test body as N real processes, one per rank, for the braid_torch tests.

A test script calls `ranks.main(body)`. Started by meson (no RANK in the
environment), it launches itself once per rank with RANK, WORLD_SIZE and the
rendezvous for the chosen init method, waits for all of them (killing the lot
after --timeout seconds) and exits 0 only if every rank did. In a rank it
calls body(rank, world_size, args); an exception fails that rank.
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse(extra=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--init", choices=["env", "tcp", "file"], default="env")
    parser.add_argument("--timeout", type=float, default=100)
    if extra:
        extra(parser)
    return parser.parse_args()


def init_method(args):
    """The init_method argument for init_process_group in this rank."""
    if args.init == "env":
        return "env://"
    if args.init == "tcp":
        return "tcp://127.0.0.1:" + os.environ["TEST_PORT"]
    return "file://" + os.environ["TEST_STORE_FILE"]


def launch(args):
    port = str(free_port())
    with tempfile.TemporaryDirectory(prefix="braid-torch-") as tmp:
        procs = []
        for rank in range(args.ranks):
            env = dict(os.environ)
            env.update({
                "RANK": str(rank), "WORLD_SIZE": str(args.ranks),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TEST_PORT": port,
                "TEST_STORE_FILE": os.path.join(tmp, "store"),
                "OMP_NUM_THREADS": "1",
            })
            procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
        deadline = time.monotonic() + args.timeout
        codes = [None] * len(procs)
        while None in codes and time.monotonic() < deadline:
            for i, p in enumerate(procs):
                if codes[i] is None:
                    codes[i] = p.poll()
            time.sleep(0.05)
        for i, p in enumerate(procs):
            if codes[i] is None:
                p.kill()
                p.wait()
                print(f"rank {i}: still running after {args.timeout} s, killed", file=sys.stderr)
                codes[i] = -9
    failed = [i for i, c in enumerate(codes) if c != 0]
    for i in failed:
        print(f"rank {i} failed (exit status {codes[i]})", file=sys.stderr)
    return 1 if failed else 0


def main(body, extra=None):
    args = parse(extra)
    if "RANK" not in os.environ:
        sys.exit(launch(args))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    try:
        body(rank, world, args)
    except BaseException:  # report every failure of the body as this rank's
        print(f"[rank {rank}] " + traceback.format_exc(), file=sys.stderr, flush=True)
        os._exit(1)
    sys.stdout.flush()
    sys.exit(0)
