#!/usr/bin/env python3
"""Tests of the perf suite (perf/*_perf), run by Meson (suite 'perf').

  perf_suite_test.py sweep   --braidrun B --binary X --ranks 3 -- FLAGS...
      exit 0, every #wrong 0, the footer, and nccl-tests' size, count and
      bandwidth conventions, checked on the --json record's exact values.
      With --fake-cuda F (tests/unit/fake_libcuda.c, built): the same with
      --mem cuda against that stand-in driver, and braid staged the buffers
      through the driver on every rank; with --gpu-refused too (a build
      without CUDA), the run fails with braid's refusal instead.
  perf_suite_test.py format  --braidrun B --binary X [--binary Y ...]
      the table as nccl-tests prints it, --help, bad flags.
  perf_suite_test.py corrupt --braidrun B --binary X [--binary Y ...]
      a wrong element on one rank makes the run fail.
  perf_suite_test.py json    --braidrun B --binary X [--binary Y ...] --plot P
      the --json record, and plot_busbw.py draws a PNG from it.

Exits 0 on success, 1 on failure, 77 (Meson's skip) when the plot has no
backend to draw with.
"""
import argparse
import ctypes
import json
import math
import os
import re
import subprocess
import sys
import tempfile

SKIP = 77
# In nccl-tests' order, that of its -d all and -o all.
ELEMENT_SIZE = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
                "half": 2, "float": 4, "double": 8, "bfloat16": 2}
ALL_TYPES = list(ELEMENT_SIZE)
ALL_OPS = ["sum", "prod", "max", "min", "avg"]

# name: (busbw factor of n ranks, size is the total of n per-rank parts,
#        reduces, has a root, has an in-place form in braid)
TESTS = {
    "all_reduce_perf": (lambda n: 2 * (n - 1) / n, False, True, False, True),
    "all_gather_perf": (lambda n: (n - 1) / n, True, False, False, True),
    "broadcast_perf": (lambda n: 1.0, False, False, True, True),
    "reduce_perf": (lambda n: 1.0, False, True, True, True),
    "reduce_scatter_perf": (lambda n: (n - 1) / n, True, True, False, True),
    "alltoall_perf": (lambda n: (n - 1) / n, True, False, False, False),
    "gather_perf": (lambda n: (n - 1) / n, True, False, True, True),
    "scatter_perf": (lambda n: (n - 1) / n, True, False, True, True),
    "sendrecv_perf": (lambda n: 1.0, False, False, False, False),
}

FOOTER_WRONG = re.compile(r"^# Out of bounds values : (\d+) (OK|FAILED)$")
FOOTER_AVG = re.compile(r"^# Avg bus bandwidth    : (\S+) ?$")


class Failure(Exception):
    pass


def expect(condition, message):
    if not condition:
        raise Failure(message)


def run(args, binary, flags, env=None):
    """Runs `binary` on args.ranks ranks; returns (exit code, rank 0's lines, all output)."""
    command = [args.braidrun, "-n", str(args.ranks), binary] + flags
    result = subprocess.run(command, capture_output=True, text=True, timeout=100, env=env)
    lines = [line[4:] for line in result.stdout.splitlines() if line.startswith("[0] ")]
    return result.returncode, lines, " ".join(command) + "\n" + result.stdout + result.stderr


def rows_of(lines):
    return [line.split() for line in lines if line.strip() and not line.startswith("#")]


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def flag(flags, short, default):
    return flags[flags.index(short) + 1] if short in flags else default


def expected_sweep(flags):
    """The sizes nccl-tests' rule gives: times the factor if above 1, else plus stepbytes."""
    low, high = parse_bytes(flag(flags, "-b", "32M")), parse_bytes(flag(flags, "-e", "32M"))
    factor, step = int(flag(flags, "-f", "1")), parse_bytes(flag(flags, "-i", "1M"))
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size = max(size * factor, size + 1) if factor > 1 else size + step
    return sizes


def expected_rows(name, flags, nranks):
    """(size, count, type, redop, root) of every row, in the order of the table."""
    _, per_rank, reduces, rooted, _ = TESTS[name]
    type_arg, op_arg, root_arg = flag(flags, "-d", "float"), flag(flags, "-o", "sum"), \
        flag(flags, "-r", "0")
    types = ALL_TYPES if type_arg == "all" else [type_arg]
    ops = (ALL_OPS if op_arg == "all" else [op_arg]) if reduces else ["none"]
    roots = (list(range(nranks)) if root_arg == "all" else [int(root_arg)]) if rooted else [-1]
    rows = []
    for type_name in types:
        elt = ELEMENT_SIZE[type_name]
        for op in ops:
            for root in roots:
                for requested in expected_sweep(flags):
                    if per_rank:
                        unit = 16 // elt
                        count = requested // elt // nranks // unit * unit
                        size = count * nranks * elt
                    else:
                        count = requested // elt
                        size = count * elt
                    rows.append((size, count, type_name, op, root))
    return rows


def close(a, b, rel=1e-9):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def check_footer(lines, name, failed):
    footer = [line for line in lines if line.startswith("# ") and ":" in line][-3:]
    expect(len(footer) == 3, f"no footer in:\n" + "\n".join(lines[-5:]))
    wrong = FOOTER_WRONG.match(footer[0])
    expect(wrong is not None, f"bad footer line {footer[0]!r}")
    expect((wrong.group(2) == "FAILED") == failed and (int(wrong.group(1)) > 0) == failed,
           f"footer {footer[0]!r}, expected {'FAILED' if failed else '0 OK'}")
    avg = FOOTER_AVG.match(footer[1])
    expect(avg is not None, f"bad footer line {footer[1]!r}")
    expect(footer[2] == f"# Collective test concluded: {name}", f"bad footer line {footer[2]!r}")
    return float(avg.group(1))


def fake_cuda_env(fake, tmp):
    """The environment of a run whose libcuda.so.1 is the stand-in `fake`."""
    driver_dir = os.path.join(tmp, "driver")
    os.makedirs(driver_dir)
    os.symlink(os.path.abspath(fake), os.path.join(driver_dir, "libcuda.so.1"))
    os.makedirs(os.path.join(tmp, "report"))
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = driver_dir + (":" + env["LD_LIBRARY_PATH"] if "LD_LIBRARY_PATH" in env else "")
    env["FAKE_CUDA_REPORT"] = os.path.join(tmp, "report")
    return env


def check_gpu_run(args, record, report_dir, output):
    """A --mem cuda run: recorded as such, every rank on a GPU, and braid
    copied every rank's buffers through the driver (a call that read the
    GPU buffers as host memory would pass the checks on the stand-in, whose
    GPU memory is host memory)."""
    expect(record["parameters"]["mem"] == "cuda", f"parameters {record['parameters']}")
    expect(all(r["gpu"] == 0 for r in record["machine"]["ranks"]),
           f"ranks {record['machine']['ranks']}")
    reports = os.listdir(report_dir)
    expect(len(reports) == args.ranks, f"{len(reports)} driver reports for {args.ranks} ranks")
    for name in reports:
        with open(os.path.join(report_dir, name)) as f:
            copies, staged = (int(x) for x in f.read().split())
        expect(staged > 0 and copies > staged,
               f"pid {name}: {copies} copies, {staged} by braid's staging:\n{output}")


def sweep(args):
    binary = args.binary[0]
    name = os.path.basename(binary)
    factor, _, _, _, in_place = TESTS[name]
    flags = args.flags
    with tempfile.TemporaryDirectory() as tmp:
        record_path = os.path.join(tmp, "run.json")
        env = None
        if args.fake_cuda:
            env = fake_cuda_env(args.fake_cuda, tmp)
            flags = flags + ["--mem", "cuda"]
        code, lines, output = run(args, binary, flags + ["--json", record_path], env)
        if args.gpu_refused:
            expect(code != 0 and "this build of braid moves host memory only" in output,
                   f"GPU buffers in a build without CUDA: exit {code}:\n{output}")
            print(f"{name}: GPU buffers refused, as a build without CUDA must")
            return
        expect(code == 0, f"exit code {code}:\n{output}")
        with open(record_path) as f:
            record = json.load(f)
        if args.fake_cuda:
            check_gpu_run(args, record, os.path.join(tmp, "report"), output)
    # -m: each timed iteration is a group of that many calls; the parameter
    # line and the record say so, and the checked call is one call (a group
    # of calls in place would apply the collective to its own result).
    agg = int(flag(flags, "-m", "1"))
    expect(any(f" iters: {flag(flags, '-n', '20')} agg iters: {agg} " in line for line in lines),
           f"no 'agg iters: {agg}' in the parameter line")
    expect(record["parameters"]["agg_iters"] == agg, f"parameters {record['parameters']}")
    table = rows_of(lines)
    want = expected_rows(name, flags, args.ranks)
    expect(len(table) == len(want), f"{len(table)} rows, expected {len(want)}:\n{output}")
    expect(len(record["rows"]) == len(want), "JSON rows differ from the table's")
    busbws = []
    for fields, row, (size, count, type_name, op, root) in zip(table, record["rows"], want):
        where = f"row {' '.join(fields)}"
        expect(len(fields) == 13, f"{where}: {len(fields)} columns, expected 13")
        expect(fields[:5] == [str(size), str(count), type_name, op, str(root)],
               f"{where}: expected size {size} count {count} {type_name} {op} root {root}")
        expect((row["size"], row["count"], row["type"], row["redop"], row["root"]) ==
               (size, count, type_name, op, root), f"{where}: JSON row {row}")
        for placement, wrong_field in (("out_of_place", 8), ("in_place", 12)):
            m = row[placement]
            if placement == "in_place" and not in_place:
                expect(fields[9:13] == ["N/A"] * 4, f"{where}: in-place should read N/A")
                expect(m["time_us"] is None, f"{where}: JSON in-place should be null")
                continue
            expect(fields[wrong_field] == "0", f"{where}: #wrong {fields[wrong_field]}")
            expect(m["wrong"] == 0, f"{where}: JSON wrong {m['wrong']}")
            # nccl-tests: algbw = S / t in GB/s (1e9), busbw = algbw * factor.
            expect(m["time_us"] > 0, f"{where}: time {m['time_us']}")
            expect(close(m["algbw_gbps"], size / m["time_us"] / 1e3),
                   f"{where}: algbw {m['algbw_gbps']} != size / time")
            expect(close(m["busbw_gbps"], m["algbw_gbps"] * factor(args.ranks)),
                   f"{where}: busbw {m['busbw_gbps']} != algbw * {factor(args.ranks)}")
            busbws.append(m["busbw_gbps"])
    avg = check_footer(lines, name, failed=False)
    expect(math.isclose(avg, sum(busbws) / len(busbws), rel_tol=1e-4, abs_tol=1e-6),
           f"Avg bus bandwidth {avg}, mean of the rows {sum(busbws) / len(busbws)}")
    expect(math.isclose(record["avg_busbw_gbps"], avg, rel_tol=1e-4, abs_tol=1e-6),
           "JSON avg_busbw_gbps differs from the footer")
    print(f"{name}: {len(table)} rows, #wrong 0, conventions hold")


def cuda_driver_loadable():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def format_check(args):
    for binary in args.binary:
        name = os.path.basename(binary)
        _, _, _, rooted, in_place = TESTS[name]
        code, lines, output = run(args, binary,
                                  ["-b", "1K", "-e", "64K", "-f", "4", "-n", "2", "-A", "1"])
        expect(code == 0, f"exit code {code}:\n{output}")
        expect(lines[0].startswith(f"# braid-tests: {name} "), f"first line {lines[0]!r}")
        expect(any(line.startswith("# nranks 3 minBytes 1024 maxBytes 65536 step: 4(factor) ")
                   for line in lines), "no parameter line")
        header = [line for line in lines if line.startswith("#") and "(elements)" in line]
        names = [line for line in lines if line.startswith("#") and "#wrong" in line]
        expect(len(header) == 1 and len(names) == 1, "no column header")
        expect(names[0].split() == ["#", "size", "count", "type", "redop", "root", "time",
                                    "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
                                    "#wrong", "algorithm"], f"columns {names[0]!r}")
        expect(header[0].split() == ["#", "(B)", "(elements)", "(us)", "(GB/s)", "(GB/s)", "(us)",
                                     "(GB/s)", "(GB/s)"], f"units {header[0]!r}")
        placement = lines[lines.index(names[0]) - 1]
        expect(placement.split() == ["#", "out-of-place", "in-place"],
               f"placement line {placement!r}")
        # Right-aligned columns, as nccl-tests prints them: every field of a row
        # ends where its column's name ends.
        ends = [m.end() for m in re.finditer(r"\S+", names[0])][1:14]
        rows = [line for line in lines if line.strip() and not line.startswith("#")]
        expect(len(rows) == 4, f"{len(rows)} rows, expected 4")
        row_pattern = re.compile(
            r"^\s*(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)" + r"\s+([\d.]+)" * 3 + r"\s+(\d+)" +
            (r"\s+([\d.]+)" * 3 + r"\s+(\d+)" if in_place else r"\s+N/A" * 4) + r"\s+(\S+)$")
        for row in rows:
            expect(row_pattern.match(row), f"row {row!r} is not nccl-tests' layout")
            row_ends = [m.end() for m in re.finditer(r"\S+", row)][:13]
            expect(row_ends == ends, f"row {row!r} is not aligned with\n{names[0]!r}")
            fields = row.split()
            expect(fields[4] == ("0" if rooted else "-1"), f"root column of {row!r}")
        check_footer(lines, name, failed=False)
        # What perf/compare_anchors.py and perf/tuner_check.py parse: braidrun's
        # "[0]" prefix, the size in field 1, times in fields 6 and 10, the
        # algorithm last (with -A 1, at least 15 fields).
        prefixed = [line.split() for line in output.splitlines() if line.startswith("[0] ")]
        parsed = [f for f in prefixed if len(f) > 6 and f[0] == "[0]" and f[1].isdigit()]
        expect(len(parsed) == 4 and all(len(f) >= 15 for f in parsed), "prefixed rows")
        for f in parsed:
            float(f[6])
            if in_place:
                float(f[10])
        expect(all(f[-1] != "-" for f in parsed), "an algorithm missing with -A 1")

        help_run = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
        expect(help_run.returncode == 0, "--help failed")
        text = help_run.stdout
        for option in ["-b, --minbytes", "-e, --maxbytes", "-i, --stepbytes", "-f, --stepfactor",
                       "-n, --iters", "-w, --warmup_iters", "-m, --agg_iters", "-c, --check",
                       "-o, --op",
                       "-d, --datatype", "-r, --root", "-a, --average", "-z, --blocking",
                       "-M, --mem", "-J, --json"]:
            expect(option in text, f"--help lacks {option}")
        testing = text.find("Testing options")
        expect(testing > 0 and text.find("corrupt_rank") > testing,
               "the test-only option is not apart under 'Testing options'")
        for bad in (["-d", "nosuch"], ["-o", "mulsum"], ["-r", "x"], ["-b", "1X"],
                    ["-b", "2M", "-e", "1M"], ["-a", "4"], ["-M", "gpu"], ["-m", "0"]):
            result = subprocess.run([binary] + bad, capture_output=True, text=True, timeout=30)
            expect(result.returncode == 2 and "see --help" in result.stderr,
                   f"{bad}: exit {result.returncode}, {result.stderr!r}")
        # --mem cuda where no CUDA driver can be loaded: the run fails saying so
        # (braidrun stops the other ranks once one fails; on a machine with a
        # driver, there is nothing to see).
        if not cuda_driver_loadable():
            code, _, output = run(args, binary, ["-b", "8", "-e", "8", "-M", "cuda"])
            expect(code != 0 and "--mem cuda: the CUDA driver (libcuda.so.1) could not be "
                                 "loaded" in output,
                   f"--mem cuda without a driver: exit {code}:\n{output}")
        print(f"{name}: table, footer and flags as nccl-tests")


def corrupt(args):
    # (flags, corrupting rank, must fail): only the root of a Reduce holds a
    # result, so a corrupting non-root changes nothing.
    cases = {
        "all_reduce_perf": [(["-d", "float", "-o", "avg"], 1, True),
                            (["-d", "int8", "-o", "sum"], 2, True)],
        "reduce_perf": [(["-d", "half", "-r", "1"], 1, True), (["-d", "half", "-r", "1"], 2, False)],
        "scatter_perf": [(["-d", "bfloat16", "-r", "0"], 2, True)],
    }
    for binary in args.binary:
        name = os.path.basename(binary)
        for flags, rank, must_fail in cases[name]:
            flags = ["-b", "1K", "-e", "4K", "-f", "4", "-n", "1", "--corrupt_rank",
                     str(rank)] + flags
            code, lines, output = run(args, binary, flags)
            rows = rows_of(lines)
            wrong = [int(f[8]) for f in rows] + [int(f[12]) for f in rows]
            if must_fail:
                expect(code != 0, f"exit code 0 with a corrupted result:\n{output}")
                expect(len(rows) == 2 and all(w > 0 for w in wrong), f"#wrong {wrong}:\n{output}")
            else:
                expect(code == 0 and all(w == 0 for w in wrong),
                       f"rank {rank} holds no result, yet:\n{output}")
            check_footer(lines, name, failed=must_fail)
            print(f"{name} {' '.join(flags)}: exit {code}, #wrong {wrong}")
    # As nccl-tests, #wrong is that of the first checked iteration with wrong
    # elements (summed over the ranks), not a sum over the -c iterations: one
    # corrupted element per check is 1, with -c 3 too.
    for binary in args.binary:
        if os.path.basename(binary) != "all_reduce_perf":
            continue
        flags = ["-b", "1K", "-e", "1K", "-n", "1", "-c", "3", "--corrupt_rank", "1"]
        code, lines, output = run(args, binary, flags)
        rows = rows_of(lines)
        wrong = [int(f[8]) for f in rows] + [int(f[12]) for f in rows]
        expect(code != 0 and wrong == [1, 1], f"-c 3: #wrong {wrong}, not [1, 1]:\n{output}")
        print(f"all_reduce_perf {' '.join(flags)}: exit {code}, #wrong {wrong}")


def json_plot(args):
    with tempfile.TemporaryDirectory() as tmp:
        records = []
        for binary in args.binary:
            name = os.path.basename(binary)
            path = os.path.join(tmp, name + ".json")
            flags = ["-b", "8", "-e", "256K", "-f", "2", "-n", "2", "-d", "all", "--json", path]
            code, lines, output = run(args, binary, flags)
            expect(code == 0, f"exit code {code}:\n{output}")
            with open(path) as f:
                record = json.load(f)
            for key in ("benchmark", "braid_version", "date", "command", "parameters", "machine",
                        "rows", "out_of_bounds", "avg_busbw_gbps", "ok"):
                expect(key in record, f"{name}: no '{key}' in the record")
            expect(record["benchmark"] == name and record["ok"] is True, f"{name}: record head")
            machine = record["machine"]
            expect(machine["nranks"] == args.ranks and machine["hostname"] and
                   len(machine["ranks"]) == args.ranks, f"{name}: machine {machine}")
            params = record["parameters"]
            expect(params["minbytes"] == 8 and params["maxbytes"] == 256 << 10 and
                   params["stepfactor"] == 2 and params["iters"] == 2 and
                   params["datatype"] == "all" and params["blocking"] == 1, f"params {params}")
            table = rows_of(lines)
            expect(len(record["rows"]) == len(table) == 10 * 16, f"{name}: row count")
            for fields, row in zip(table, record["rows"]):
                expect([str(row[k]) for k in ("size", "count", "type", "redop", "root")] ==
                       fields[:5], f"{name}: JSON {row} for table {fields}")
                for placement in ("out_of_place", "in_place"):
                    expect(set(row[placement]) ==
                           {"time_us", "algbw_gbps", "busbw_gbps", "wrong", "algorithm"},
                           f"{name}: {placement} keys")
                expect(row["algorithm"] is None or isinstance(row["algorithm"], str),
                       f"{name}: algorithm {row['algorithm']}")
            expect(any(row["algorithm"] for row in record["rows"] if row["count"] > 0),
                   f"{name}: no algorithm recorded")
            records.append(path)

        png = os.path.join(tmp, "busbw.png")
        result = subprocess.run([sys.executable, args.plot, *records, "-o", png, "--label",
                                 "first", "--title", "perf suite test"],
                                capture_output=True, text=True, timeout=60)
        if result.returncode == 3:
            print(f"skipped: {result.stderr.strip()}")
            return SKIP
        expect(result.returncode == 0, f"plot_busbw.py failed:\n{result.stdout}{result.stderr}")
        with open(png, "rb") as f:
            data = f.read()
        expect(len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG")
        print(f"records ok; {result.stdout.strip()}, {len(data)} bytes")

        missing = subprocess.run([sys.executable, args.plot, os.path.join(tmp, "none.json"), "-o",
                                  png], capture_output=True, text=True, timeout=60)
        expect(missing.returncode == 1 and "cannot read" in missing.stderr,
               "a missing record should fail clearly")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["sweep", "format", "corrupt", "json"])
    p.add_argument("--braidrun", required=True)
    p.add_argument("--binary", action="append", required=True)
    p.add_argument("--ranks", type=int, default=3)
    p.add_argument("--plot")
    p.add_argument("--fake-cuda", help="sweep: run with --mem cuda against this stand-in driver")
    p.add_argument("--gpu-refused", action="store_true",
                   help="with --fake-cuda: braid has no CUDA and must refuse the buffers")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = p.parse_args(argv[:split])
    args.flags = argv[split + 1:]
    try:
        if args.mode == "sweep":
            sweep(args)
        elif args.mode == "format":
            format_check(args)
        elif args.mode == "corrupt":
            corrupt(args)
        else:
            return json_plot(args)
    except Failure as failure:
        print(f"FAIL: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
