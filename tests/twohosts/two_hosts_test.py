#!/usr/bin/env python3
"""Two "hosts" on one machine: two network namespaces joined by a veth pair,
each rank in its own UTS namespace with its host's name, two ranks per host.
The topology detector must pick shm inside each host and tcp between them,
and the collectives must pass across both. Needs root (namespaces); exits
77 (skipped) without it, saying why.

  two_hosts_test.py RANK_PROGRAM
"""
import os
import secrets
import shutil
import subprocess
import sys
import uuid

HOSTS = ["a", "a", "b", "b"]


def run(*cmd, check=True):
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def skip(why):
    print(f"SKIP: {why}")
    sys.exit(77)


def main():
    program = os.path.abspath(sys.argv[1])
    if os.geteuid() != 0:
        skip("network namespaces need root")
    for tool in ("ip", "unshare"):
        if not shutil.which(tool):
            skip(f"'{tool}' is not installed (Debian: iproute2, util-linux)")
    tag = uuid.uuid4().hex[:6]
    ns = {h: f"braid-{h}-{tag}" for h in ("a", "b")}
    addr = {"a": "10.231.0.1", "b": "10.231.0.2"}
    veth = {"a": f"bra{tag}", "b": f"brb{tag}"}
    try:
        try:
            for h in ns:
                run("ip", "netns", "add", ns[h])
        except subprocess.CalledProcessError as e:
            skip(f"cannot create a network namespace: {e.stderr.strip()}")
        run("ip", "link", "add", veth["a"], "type", "veth", "peer", "name", veth["b"])
        for h in ns:
            run("ip", "link", "set", veth[h], "netns", ns[h])
            run("ip", "-n", ns[h], "addr", "add", addr[h] + "/24", "dev", veth[h])
            run("ip", "-n", ns[h], "link", "set", veth[h], "up")
            run("ip", "-n", ns[h], "link", "set", "lo", "up")
        env = dict(os.environ)
        for k in list(env):
            if k.startswith("BRAID_") and k not in ("BRAID_DEBUG",):
                del env[k]
        env.update({
            "BRAID_WORLD_SIZE": str(len(HOSTS)),
            "BRAID_ADDR": f"{addr['a']}:29517",
            "BRAID_SECRET": secrets.token_hex(16),
            "BRAID_TIMEOUT": "60",
            "HOSTS": ",".join(HOSTS),
        })
        procs = []
        for rank, h in enumerate(HOSTS):
            rank_env = dict(env, BRAID_RANK=str(rank))
            # A UTS namespace of its own gives the rank its host's name.
            cmd = ["ip", "netns", "exec", ns[h], "unshare", "--uts", "sh", "-c",
                   f'hostname braid-host-{h} && exec "$0"', program]
            procs.append(subprocess.Popen(cmd, env=rank_env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        failed = False
        for rank, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
                out += "\n(killed after 120 s)"
            print(f"--- rank {rank} (host {HOSTS[rank]}), exit {p.returncode}\n{out.strip()}")
            failed = failed or p.returncode != 0
        sys.exit(1 if failed else 0)
    finally:
        for h in ns:
            run("ip", "netns", "del", ns[h], check=False)


if __name__ == "__main__":
    main()
