#!/usr/bin/env python3
"""Runs one fuzz target the way the "fuzz" suite does: every input of its
corpus first, then new inputs for a bounded time. Any crash, sanitizer
report, leak, timeout or out-of-memory fails the test; libFuzzer then writes
the input that caused it under ARTIFACT_DIR, and this prints how to replay it.

  run_fuzzer.py FUZZER CORPUS_DIR SECONDS ARTIFACT_DIR

FUZZ_SECONDS in the environment overrides SECONDS. 0 runs the corpus only.
The corpus is read, never written: inputs found on the way go to a
temporary directory (docs/RELIABILITY.md says how to add some to the corpus).
"""
import os
import subprocess
import sys
import tempfile

fuzzer, corpus, seconds, artifacts = sys.argv[1:5]
seconds = int(os.environ.get("FUZZ_SECONDS", seconds))
os.makedirs(artifacts, exist_ok=True)

# The targets set BRAID_* variables themselves; the caller's would only make
# runs differ from one shell to the next.
env = {k: v for k, v in os.environ.items() if not k.startswith("BRAID_")}
env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")

with tempfile.TemporaryDirectory(prefix="braid-fuzz-") as found:
    command = [fuzzer,
               f"-artifact_prefix={artifacts}/",
               "-timeout=10",         # seconds per input: anything slower is a hang
               "-rss_limit_mb=2048",  # and one allocation above it is a failure too
               "-print_final_stats=1"]
    command += [f"-max_total_time={seconds}"] if seconds > 0 else ["-runs=0"]
    command += [found, corpus]
    print("+", " ".join(command), flush=True)
    try:
        status = subprocess.run(command, env=env, timeout=seconds + 120).returncode
    except subprocess.TimeoutExpired:
        print(f"the fuzzer ran {seconds + 120} s, past its own limit of {seconds} s")
        sys.exit(1)
if status != 0:
    print(f"\nfailed (exit {status}); replay the input above with: {fuzzer} <crash file>")
# libFuzzer exits 77 when it finds something (its -error_exitcode), which
# meson reads as a skipped test: a finding must fail.
sys.exit(1 if status != 0 else 0)
