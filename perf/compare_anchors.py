#!/usr/bin/env python3
"""braid against the anchor libraries (Open MPI, MPICH, Gloo, memcpy), in one interleaved run.

Every target compares one braid measurement with one anchor measurement of the same thing
(same collective, size, ranks, datatype float32, op sum, byte and bandwidth conventions of
nccl-tests). For every target the braid perf binary and the anchor program are launched next
to each other, and that is repeated --reps times (repetition outer, target inner; repetition 1
launches braid first, repetition 2 the anchors first, and so on). This machine changes speed
from one launch to the next, so a target is judged on the MEDIAN OF THE PAIRWISE RATIOS: each
braid launch divided by the anchor launch next to it. Medians of each side are shown too.
--list prints the targets' commands.

  ratio = braid busbw / anchor busbw    (bandwidth targets, pass: ratio >= target)
  ratio = braid time / anchor time      (latency targets,   pass: ratio <= target)

Anchors come from the anchor suite (gloo_bench, mpi_bench_openmpi, mpi_bench_mpich,
memcpy_bench). Missing ones are built with the suite's own script (BUILD_ONLY=1 run.sh) in a
copy of its sources (--anchor-src, into --anchor-build).

  perf/compare_anchors.py --build build                 # 5 repetitions, a few minutes
  perf/compare_anchors.py --build build --quick         # 1 repetition, short runs
  perf/compare_anchors.py --build build --only 1a,4b --reps 3 --json samples.json

Exit status 0 whatever the verdicts (a benchmark, not a test); with --strict, 1 when a target
misses or could not be measured.
"""
import argparse
import datetime
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIB = 1 << 20

GLOO_ALLREDUCE = ["allreduce_ring", "allreduce_ring_chunked", "allreduce_halving_doubling",
                  "allreduce_bcube", "allreduce_new_ring", "allreduce_new_bcube"]
OMPI_SHM = ["--mca", "pml", "ob1", "--mca", "btl", "self,vader"]
OMPI_TCP = ["--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo"]
ANCHOR_BINARIES = ["gloo_bench", "mpi_bench_openmpi", "mpi_bench_mpich", "memcpy_bench"]

# ------------------------------------------------------------------------------- measurements
# A braid measurement: (transport, ranks, perf binary, size in bytes). Its launch yields
# both placements; each target picks the column that matches its anchor.
MEASUREMENTS = {
    "shm-allreduce-64M": ("shm", 2, "all_reduce_perf", 64 * MIB),
    "shm-allreduce-1M": ("shm", 2, "all_reduce_perf", 1 * MIB),
    "shm-allreduce-8": ("shm", 2, "all_reduce_perf", 8),
    "shm-broadcast-64M": ("shm", 2, "broadcast_perf", 64 * MIB),
    "shm-allgather-64M": ("shm", 2, "all_gather_perf", 64 * MIB),
    "tcp-allreduce-64M": ("tcp", 2, "all_reduce_perf", 64 * MIB),
    "tcp-allreduce-8": ("tcp", 2, "all_reduce_perf", 8),
    "shm4-allreduce-1M": ("shm", 4, "all_reduce_perf", 1 * MIB),
    "shm4-allreduce-64M": ("shm", 4, "all_reduce_perf", 64 * MIB),
}

# A target: id, text, braid measurement, braid placement, anchor, metric, comparison, threshold.
# Placements: MPI's collectives are out of place (MPI_Bcast has one buffer: braid's in-place
# Broadcast is the same call); gloo_bench's AllReduce is in place.
TARGETS = [
    ("1a", "shm AllReduce 64 MiB, 2 ranks", "shm-allreduce-64M", "out_of_place",
     "ompi-shm-allreduce-64M", "busbw", ">=", 2.5),
    ("1b", "shm AllReduce 64 MiB, 2 ranks", "shm-allreduce-64M", "out_of_place",
     "memcpy-64M", "busbw", ">=", 0.33),
    ("2a", "shm AllReduce 1 MiB, 2 ranks", "shm-allreduce-1M", "out_of_place",
     "mpich-shm-allreduce-1M", "busbw", ">=", 1.5),
    ("2b", "shm AllReduce 8 B, 2 ranks", "shm-allreduce-8", "out_of_place",
     "ompi-shm-allreduce-8", "time", "<=", 1.0),
    ("3a", "shm Broadcast 64 MiB, 2 ranks", "shm-broadcast-64M", "in_place",
     "ompi-shm-bcast-64M", "busbw", ">=", 1.3),
    ("3b", "shm AllGather 64 MiB, 2 ranks", "shm-allgather-64M", "out_of_place",
     "ompi-shm-allgather-64M", "busbw", ">=", 1.5),
    ("4a", "tcp AllReduce 64 MiB, 2 ranks", "tcp-allreduce-64M", "in_place",
     "gloo-allreduce-64M", "busbw", ">=", 2.0),
    ("4b", "tcp AllReduce 8 B, 2 ranks", "tcp-allreduce-8", "out_of_place",
     "ompi-tcp-allreduce-8", "time", "<=", 1.0),
    ("5a", "shm AllReduce 1 MiB, 4 ranks", "shm4-allreduce-1M", "out_of_place",
     "ompi4-shm-allreduce-1M", "busbw", ">=", 1.0),
    ("5b", "shm AllReduce 64 MiB, 4 ranks", "shm4-allreduce-64M", "out_of_place",
     "ompi4-shm-allreduce-64M", "busbw", ">=", 1.0),
]

# An anchor: (kind, label, ranks, op, size); kinds: ompi-shm, ompi-tcp, mpich, gloo, memcpy.
ANCHORS = {
    "ompi-shm-allreduce-64M": ("ompi-shm", "Open MPI shm", 2, "allreduce", 64 * MIB),
    "memcpy-64M": ("memcpy", "memcpy 1 thread", 1, "memcpy", 64 * MIB),
    "mpich-shm-allreduce-1M": ("mpich", "MPICH shm", 2, "allreduce", 1 * MIB),
    "ompi-shm-allreduce-8": ("ompi-shm", "Open MPI shm", 2, "allreduce", 8),
    "ompi-shm-bcast-64M": ("ompi-shm", "Open MPI shm", 2, "bcast", 64 * MIB),
    "ompi-shm-allgather-64M": ("ompi-shm", "Open MPI shm", 2, "allgather", 64 * MIB),
    "gloo-allreduce-64M": ("gloo", "Gloo tcp, best", 2, "allreduce", 64 * MIB),
    "ompi-tcp-allreduce-8": ("ompi-tcp", "Open MPI tcp", 2, "allreduce", 8),
    "ompi4-shm-allreduce-1M": ("ompi-shm", "Open MPI shm", 4, "allreduce", 1 * MIB),
    "ompi4-shm-allreduce-64M": ("ompi-shm", "Open MPI shm", 4, "allreduce", 64 * MIB),
}


def size_text(nbytes):
    """The anchors' spelling of a size: 8B, 64K, 1M."""
    if nbytes >= MIB and nbytes % MIB == 0:
        return f"{nbytes // MIB}M"
    if nbytes >= 1024 and nbytes % 1024 == 0:
        return f"{nbytes // 1024}K"
    return f"{nbytes}B"


def size_arg(nbytes):
    """A size as a command-line argument: 8, 1M, 64M."""
    text = size_text(nbytes)
    return text[:-1] if text.endswith("B") else text


def braid_iters(nbytes, quick):
    """(timed, warm-up) iterations of one braid launch: ~0.05-2 s at the speeds seen here."""
    if nbytes <= 4096:
        timed, warm = 20000, 1000
    elif nbytes <= 4 * MIB:
        timed, warm = 200, 20
    else:
        timed, warm = 20, 3
    if quick:
        timed, warm = max(3, timed // 10), max(1, warm // 3)
    return timed, warm


# ------------------------------------------------------------------------------- commands
class Launch:
    """One process launch: its command, extra environment, and how to read its output."""

    def __init__(self, who, argv, env, parse, json_path=None):
        self.who, self.argv, self.env, self.parse, self.json_path = who, argv, env, parse, json_path

    def shell(self):
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        argv = " ".join("<tmp>.json" if a == self.json_path else shlex.quote(a) for a in self.argv)
        return (env + " " if env else "") + argv


def braid_launch(args, key, tmpdir):
    transport, ranks, binary, nbytes = MEASUREMENTS[key]
    timed, warm = braid_iters(nbytes, args.quick)
    json_path = os.path.join(tmpdir, f"{key}.json")
    argv = [os.path.join(args.build, "tools", "braidrun"), "-n", str(ranks),
            os.path.join(args.build, "perf", binary), "-b", size_arg(nbytes),
            "-e", size_arg(nbytes), "-n", str(timed), "-w", str(warm), "-c", "0", "-a", "3",
            "-J", json_path] + shlex.split(args.braid_args)

    def parse(stdout):
        with open(json_path) as f:
            doc = json.load(f)
        os.unlink(json_path)
        rows = doc["rows"]
        if len(rows) != 1:
            raise RuntimeError(f"{len(rows)} rows in {binary}'s JSON, expected 1")
        row = rows[0]
        values = {"size": row["size"], "algorithm": row.get("algorithm")}
        for placement in ("out_of_place", "in_place"):
            m = row[placement]
            if m["time_us"] is not None:
                values[placement] = {"time": m["time_us"], "busbw": m["busbw_gbps"],
                                     "algorithm": m.get("algorithm")}
        return values

    return Launch("braid", argv, {"BRAID_TRANSPORT": transport}, parse, json_path)


def parse_bench_rows(stdout):
    """Rows of gloo_bench / mpi_bench: op size count time_us min_us algbw busbw check K smp."""
    rows = []
    for line in stdout.splitlines():
        f = line.split()
        if len(f) >= 10 and not f[0].startswith("#"):
            rows.append({"op": f[0], "size": f[1], "time": float(f[3]), "min_time": float(f[4]),
                         "busbw": float(f[6]), "check": f[7], "K": int(f[8]), "samples": int(f[9])})
    return rows


def anchor_launch(args, key):
    kind, _, ranks, op, nbytes = ANCHORS[key]
    a = args.anchors
    if kind == "memcpy":
        samples, ms = ("3", "10") if args.quick else ("9", "40")
        argv = [os.path.join(a, "memcpy_bench"), "-t", "1", "-b", size_arg(nbytes),
                "-e", size_arg(nbytes),
                "--samples", samples, "--ms", ms]

        def parse(stdout):
            for line in stdout.splitlines():
                f = line.split()
                if len(f) >= 6 and f[0] == "memcpy" and f[1] == size_text(nbytes):
                    # GB/s = bytes / time, the algbw of a copy
                    return {"time": float(f[2]), "busbw": float(f[3])}
            raise RuntimeError("no memcpy row in memcpy_bench's output")

        return Launch("memcpy", argv, {}, parse)

    budget = [f"{args.budget:g}"]
    if kind == "gloo":
        argv = [os.path.join(a, "gloo_bench"), "-n", str(ranks), "-o", ",".join(GLOO_ALLREDUCE),
                "-s", size_arg(nbytes), "--budget"] + budget + ["--min-iters", "3",
                                                                 "--timeout-s", "120"]
        env = {}
        wanted = set(GLOO_ALLREDUCE)
    else:
        binary = "mpi_bench_mpich" if kind == "mpich" else "mpi_bench_openmpi"
        bench = [os.path.join(a, binary), "-o", op, "-s", size_arg(nbytes), "--budget"] + budget
        bench += ["--min-iters", "3"]
        if kind == "mpich":
            argv = ["mpirun.mpich", "-np", str(ranks)] + bench
            env = {}
        else:
            argv = (["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)]
                    + (OMPI_SHM if kind == "ompi-shm" else OMPI_TCP) + bench)
            env = {"OMPI_MCA_btl_base_warn_component_unused": "0"}
        wanted = {op}

    def parse(stdout):
        rows = [r for r in parse_bench_rows(stdout)
                if r["op"] in wanted and r["size"] == size_text(nbytes)]
        if not rows:
            raise RuntimeError(f"no {size_text(nbytes)} row in the anchor's output")
        bad = [r["op"] for r in rows if r["check"] != "OK"]
        if bad:
            raise RuntimeError("anchor's correctness check failed: " + ",".join(bad))
        best = max(rows, key=lambda r: r["busbw"])  # gloo: the best algorithm of this launch
        return {"time": best["time"], "busbw": best["busbw"], "op": best["op"],
                "all": {r["op"]: r["busbw"] for r in rows} if len(rows) > 1 else None}

    return Launch(kind, argv, env, parse)


def session_members(sid):
    """Processes of session `sid` (a launch's own session: mpirun's ranks leave its group)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(entry))
    return pids


def stop_session(proc):
    """Stops a launch that ran past its time: SIGTERM to its launcher (mpirun then stops its
    ranks), then SIGKILL to whatever of the launch's session is left."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and session_members(proc.pid):
        time.sleep(0.1)
    for pid in session_members(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_launch(launch, timeout):
    env = dict(os.environ)
    env.pop("BRAID_TRANSPORT", None)
    env.update(launch.env)
    record = {"who": launch.who, "command": launch.shell(),
              "start": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if launch.json_path and os.path.exists(launch.json_path):
        os.unlink(launch.json_path)  # never read a file a failed launch left behind
    t0 = time.monotonic()
    proc = subprocess.Popen(launch.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_session(proc)
        stdout, stderr = proc.communicate()
        record.update(wall_s=round(time.monotonic() - t0, 3), rc=None,
                      error=f"timed out after {timeout} s", stderr_tail=stderr[-2000:])
        return record
    record.update(wall_s=round(time.monotonic() - t0, 3), rc=proc.returncode)
    try:
        if proc.returncode != 0:
            raise RuntimeError(f"exit status {proc.returncode}")
        record["values"] = launch.parse(stdout)
    except Exception as error:  # a failed launch is reported, the run goes on
        record["error"] = str(error)
        record["stdout_tail"] = stdout[-2000:]
        record["stderr_tail"] = stderr[-2000:]
    return record


# ------------------------------------------------------------------------------- anchors' build
def ensure_anchors(args, needed):
    missing = [b for b in needed if not os.access(os.path.join(args.anchors, b), os.X_OK)]
    if not missing:
        return
    build = args.anchor_build
    print(f"# anchors {', '.join(missing)} missing in {args.anchors}: building them in {build} "
          f"(BUILD_ONLY=1 run.sh, sources from {args.anchor_src})", file=sys.stderr)
    if not os.path.isfile(os.path.join(args.anchor_src, "run.sh")):
        sys.exit(f"compare_anchors.py: no anchor sources (run.sh) in {args.anchor_src}; "
                 "give --anchors or --anchor-src")
    os.makedirs(build, exist_ok=True)
    for name in os.listdir(args.anchor_src):
        src = os.path.join(args.anchor_src, name)
        if os.path.isfile(src):
            shutil.copy2(src, os.path.join(build, name))
    sys.stdout.flush()
    result = subprocess.run(["./run.sh"], cwd=build, env=dict(os.environ, BUILD_ONLY="1"),
                            stdout=sys.stderr)
    missing = [b for b in needed if not os.access(os.path.join(build, b), os.X_OK)]
    if result.returncode != 0 or missing:
        sys.exit(f"compare_anchors.py: building the anchors in {build} failed "
                 f"(run.sh exit {result.returncode}; missing: {' '.join(missing) or 'none'})")
    args.anchors = build


def needed_binaries(targets):
    needed = set()
    for t in targets:
        kind = ANCHORS[t[4]][0]
        needed.add({"memcpy": "memcpy_bench", "gloo": "gloo_bench", "mpich": "mpi_bench_mpich"}
                   .get(kind, "mpi_bench_openmpi"))
    return sorted(needed)


def needed_tools(targets):
    tools = set()
    for t in targets:
        kind = ANCHORS[t[4]][0]
        if kind.startswith("ompi"):
            tools.add("mpirun.openmpi")
        elif kind == "mpich":
            tools.add("mpirun.mpich")
    return sorted(tools)


# ------------------------------------------------------------------------------- report
def fmt_value(metric, value):
    if value is None:
        return "-"
    if metric == "time":
        return f"{value:.2f} us" if value < 1000 else f"{value:.0f} us"
    return f"{value:.2f} GB/s"


def summarize(targets, samples):
    """Per target: braid and anchor values per repetition, pairwise ratios, medians, verdict."""
    results = []
    for tid, text, mkey, placement, akey, metric, cmp, threshold in targets:
        braid_vals, anchor_vals, ratios, winners, failed = [], [], [], {}, []
        for rep in samples:
            b = rep["braid"].get(mkey, {})
            a = rep["anchors"].get(akey, {})
            failed += [f"rep {rep['rep']} {r['who']}: {r['error']}" for r in (b, a) if "error" in r]
            bv = b.get("values", {}).get(placement, {}).get(metric)
            av = a.get("values", {}).get(metric)
            if bv is not None:
                braid_vals.append(bv)
            if av is not None:
                anchor_vals.append(av)
                op = a["values"].get("op")
                if a["values"].get("all"):
                    winners[op] = winners.get(op, 0) + 1
            if bv is not None and av is not None and av > 0:
                ratios.append(bv / av)
        ratio = statistics.median(ratios) if ratios else None
        if ratio is None:
            verdict = "ERROR"
        elif cmp == ">=":
            verdict = "PASS" if ratio >= threshold else "MISS"
        else:
            verdict = "PASS" if ratio <= threshold else "MISS"
        results.append({
            "id": tid, "target": text, "metric": metric, "braid_placement": placement,
            "anchor": ANCHORS[akey][1], "comparison": cmp, "threshold": threshold,
            "braid_median": statistics.median(braid_vals) if braid_vals else None,
            "anchor_median": statistics.median(anchor_vals) if anchor_vals else None,
            "ratios": ratios, "ratio_median": ratio, "verdict": verdict,
            "best_gloo_algorithm": max(winners, key=winners.get) if winners else None,
            "failed_launches": failed,
        })
    return results


def print_report(results, targets, launches, reps_done):
    print(f"# braid against the anchors: {reps_done} interleaved repetition(s), float32 sum; "
          "ratio = braid/anchor, median of the pairwise ratios (range in brackets)")
    head = (f"{'id':<3} {'target':<31} {'metric':<6} {'anchor':<16} {'braid':>11} {'anchor':>11} "
            f"{'ratio':>6} {'[min-max]':>14} {'target':>8}  result")
    print(head)
    print("-" * len(head))
    for r in results:
        ratios = r["ratios"]
        spread = f"[{min(ratios):.2f}-{max(ratios):.2f}]" if ratios else "-"
        ratio = f"{r['ratio_median']:.2f}" if r["ratio_median"] is not None else "-"
        anchor = r["anchor"]
        print(f"{r['id']:<3} {r['target']:<31} {r['metric']:<6} {anchor:<16} "
              f"{fmt_value(r['metric'], r['braid_median']):>11} "
              f"{fmt_value(r['metric'], r['anchor_median']):>11} {ratio:>6} {spread:>14} "
              f"{r['comparison'] + ' ' + format(r['threshold'], '.2f'):>8}  {r['verdict']}")
    notes = [f"{r['id']}: best Gloo algorithm (most often) {r['best_gloo_algorithm']}"
             for r in results if r["best_gloo_algorithm"]]
    print("# busbw in GB/s (1e9 B/s) with nccl-tests' factors (AllReduce 2(n-1)/n, AllGather "
          "(n-1)/n of the total output size, Broadcast 1); memcpy: bytes/time of one thread.")
    print("# braid: time = max over ranks (-a 3) of one launch's mean over back-to-back calls; "
          "anchors: median over samples of the max over ranks.")
    print("# braid column: out-of-place against MPI and memcpy, in-place against Broadcast "
          "(MPI_Bcast) and Gloo (in-place AllReduce).")
    for note in notes:
        print("# " + note)
    for r in results:
        for failure in r["failed_launches"]:
            print(f"# {r['id']}: failed launch, {failure}")
    print()
    print_commands(targets, launches)


def print_commands(targets, launches):
    print("# commands (each repetition runs, per target, braid and its anchors next to each "
          "other; every second repetition in the reverse order)")
    first = {}
    for tid, text, mkey, placement, akey, *_ in targets:
        if mkey in first:
            print(f"{tid} braid : the launch of {first[mkey]}")
        else:
            first[mkey] = tid
            print(f"{tid} braid : {launches['braid'][mkey].shell()}")
        print(f"{tid} anchor: {launches['anchors'][akey].shell()}")


# ------------------------------------------------------------------------------- main
def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default=os.path.join(REPO, "build"),
                   help="braid build folder with tools/braidrun and perf/ (default: %(default)s)")
    p.add_argument("--anchors", default="/tmp/anchors",
                   help="folder with the built anchor programs (default: %(default)s)")
    p.add_argument("--anchor-src", default=os.path.normpath(os.path.join(REPO, "..", "shared",
                                                                          "anchors")),
                   help="anchor suite sources, used when a program is missing "
                        "(default: %(default)s)")
    p.add_argument("--anchor-build", default="/tmp/braid-anchors",
                   help="where missing anchor programs are built (default: %(default)s)")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 5; --quick 1)")
    p.add_argument("--budget", type=float, default=None,
                   help="timed seconds per anchor measurement, the anchors' --budget "
                        "(default 0.5; --quick 0.1)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1 repetition, 10x fewer braid iterations, short anchor runs")
    p.add_argument("--only", default="",
                   help="comma-separated target ids to run, e.g. 1a,4b (default: all)")
    p.add_argument("--braid-args", default="",
                   help="more flags for braid's perf binaries, e.g. '-R 1' (buffers from "
                        "braidHostAlloc)")
    p.add_argument("--timeout", type=int, default=300, help="seconds per launch (default 300)")
    p.add_argument("--json", metavar="FILE", help="write every launch's raw figures to FILE")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when a target misses or could not be measured")
    p.add_argument("--list", action="store_true", help="print the targets and commands and exit")
    args = p.parse_args()
    args.reps = args.reps if args.reps is not None else (1 if args.quick else 5)
    if args.reps < 1:
        p.error("--reps must be at least 1")
    args.budget = args.budget if args.budget is not None else (0.1 if args.quick else 0.5)
    args.build = os.path.abspath(args.build)

    targets = TARGETS
    if args.only:
        wanted = [t.strip() for t in args.only.split(",") if t.strip()]
        unknown = set(wanted) - {t[0] for t in TARGETS}
        if unknown:
            p.error(f"unknown target(s) {', '.join(sorted(unknown))}; ids: "
                    + ", ".join(t[0] for t in TARGETS))
        targets = [t for t in TARGETS if t[0] in wanted]

    # Measurements in target order; each braid measurement with the anchors of its targets.
    plan = {}
    for t in targets:
        plan.setdefault(t[2], [])
        if t[4] not in plan[t[2]]:
            plan[t[2]].append(t[4])

    with tempfile.TemporaryDirectory(prefix="compare_anchors.") as tmpdir:
        if not args.list:
            for tool in needed_tools(targets):
                if shutil.which(tool) is None:
                    sys.exit(f"compare_anchors.py: {tool} not found (the anchor suite's run.sh "
                             "installs Open MPI and MPICH)")
            for binary in {MEASUREMENTS[m][2] for m in plan}:
                for path in (os.path.join(args.build, "tools", "braidrun"),
                             os.path.join(args.build, "perf", binary)):
                    if not os.access(path, os.X_OK):
                        sys.exit(f"compare_anchors.py: {path} missing; build braid, give --build")
            ensure_anchors(args, needed_binaries(targets))
        launches = {"braid": {m: braid_launch(args, m, tmpdir) for m in plan},
                    "anchors": {a: anchor_launch(args, a) for m in plan for a in plan[m]}}
        if args.list:
            print_commands(targets, launches)
            return 0

        started = datetime.datetime.now(datetime.timezone.utc)
        braid_env = {k: v for k, v in os.environ.items()
                     if k.startswith("BRAID_") and k != "BRAID_TRANSPORT"}
        print(f"# {started.isoformat(timespec='seconds')}  host {os.uname().nodename}  "
              f"cpus {os.cpu_count()}  load {' '.join(open('/proc/loadavg').read().split()[:3])}  "
              f"reps {args.reps}  anchor budget {args.budget:g} s"
              + (f"  environment {braid_env}" if braid_env else ""))
        sys.stdout.flush()
        samples = []
        for rep in range(args.reps):
            record = {"rep": rep + 1, "braid": {}, "anchors": {}}
            samples.append(record)
            anchor_first = rep % 2 == 1
            for mkey, akeys in plan.items():
                # braid first, then its anchors; mirrored every second repetition
                order = [("braid", mkey)] + [("anchors", a) for a in akeys]
                if anchor_first:
                    order.reverse()
                line = []
                for side, key in order:
                    launch = launches[side][mkey if side == "braid" else key]
                    result = run_launch(launch, args.timeout)
                    record[side][key] = result
                    if "error" in result:
                        line.append(f"{launch.who} ERROR ({result['error']})")
                    elif side == "braid":
                        v = result["values"]
                        line.append("braid " + ", ".join(
                            f"{short} {v[pl]['time']:.2f} us {v[pl]['busbw']:.2f} GB/s"
                            for pl, short in (("out_of_place", "oop"), ("in_place", "ip"))
                            if pl in v))
                    else:
                        v = result["values"]
                        line.append(f"{ANCHORS[key][1]} {v['time']:.2f} us {v['busbw']:.2f} GB/s")
                print(f"# rep {rep + 1}/{args.reps} {mkey}: " + " | ".join(line), file=sys.stderr)
                sys.stderr.flush()

        results = summarize(targets, samples)
        if args.json:
            document = {
                "started": started.isoformat(timespec="seconds"),
                "host": os.uname().nodename,
                "settings": {"reps": args.reps, "quick": args.quick, "budget_s": args.budget,
                             "build": args.build, "anchors": args.anchors,
                             "braid_environment": braid_env},
                "commands": {"braid": {m: l.shell() for m, l in launches["braid"].items()},
                             "anchors": {a: l.shell() for a, l in launches["anchors"].items()}},
                "targets": results,
                "samples": samples,
            }
            with open(args.json, "w") as f:
                json.dump(document, f, indent=1)
                f.write("\n")
        print_report(results, targets, launches, len(samples))
        if args.strict and any(r["verdict"] != "PASS" for r in results):
            return 1
        return 0


if __name__ == "__main__":
    sys.exit(main())
