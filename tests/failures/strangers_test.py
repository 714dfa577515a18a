#!/usr/bin/env python3
"""Strangers at the rendezvous: a connection that says nothing, one that
sends garbage, and a process with another job's secret. Each is refused and
logged; none crashes rank 0, stalls the ranks that arrive after it, or joins.

  strangers_test.py ENV_RANK_PROGRAM
"""
import os
import socket
import subprocess
import sys
import time

PROGRAM = sys.argv[1]
SECRET = "00112233445566778899aabbccddeeff"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(mode):
    port = free_port()
    env = dict(os.environ, BRAID_WORLD_SIZE="2", BRAID_ADDR=f"127.0.0.1:{port}",
               BRAID_SECRET=SECRET, BRAID_TIMEOUT="30")
    rank0 = subprocess.Popen([PROGRAM], env=dict(env, BRAID_RANK="0"), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    stranger = None
    for _ in range(100):  # rank 0 listens within a moment
        try:
            stranger = socket.create_connection(("127.0.0.1", port), timeout=1)
            break
        except OSError:
            time.sleep(0.05)
    if stranger is None:
        rank0.kill()
        return [f"{mode}: rank 0 never listened on {port}"]
    problems = []
    if mode == "garbage":
        stranger.sendall(os.urandom(4096))
    if mode == "wrong-secret":
        impostor = subprocess.run([PROGRAM], env=dict(env, BRAID_RANK="1",
                                                      BRAID_SECRET="ff" * 16),
                                  capture_output=True, text=True, timeout=60)
        if impostor.returncode == 0:
            problems.append(f"{mode}: a rank with another secret joined")
    start = time.time()
    rank1 = subprocess.run([PROGRAM], env=dict(env, BRAID_RANK="1"), capture_output=True,
                           text=True, timeout=60)
    out0, _ = rank0.communicate(timeout=60)
    seconds = time.time() - start
    stranger.close()
    if rank1.returncode != 0 or rank0.returncode != 0:
        problems.append(f"{mode}: the job failed: rank 0 said {out0!r}, rank 1 {rank1.stderr!r}")
    if seconds > 5:
        problems.append(f"{mode}: the stranger held the job up for {seconds:.1f} s")
    if mode != "silent" and "refused a connection" not in out0:
        problems.append(f"{mode}: rank 0 did not log the refusal: {out0!r}")
    print(f"{mode}: job done in {seconds:.2f} s; rank 0 said: {out0.strip()}")
    return problems


def main():
    problems = []
    for mode in ("silent", "garbage", "wrong-secret"):
        problems += run(mode)
    for p in problems:
        print("FAIL:", p)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
