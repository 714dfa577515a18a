#!/usr/bin/env python3
"""Plots bus bandwidth against size from the --json records of the perf tests.

    build/tools/braidrun -n 4 build/perf/all_reduce_perf -b 8 -e 64M -f 2 --json ar.json
    build/tools/braidrun -n 4 build/perf/all_gather_perf -b 8 -e 64M -f 2 --json ag.json
    perf/plot_busbw.py ar.json ag.json -o busbw.png

One line per file (per datatype, op and root too when a file holds several),
size on a log-2 axis. A line's label is --label (one per file, in order), else
the file's benchmark name and rank count. Draws with matplotlib when it is
installed, else with gnuplot; exits 3 when neither is.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

NO_BACKEND_EXIT = 3


def size_label(size):
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift}{unit}"
    return str(size)


def load_series(paths, labels, placement):
    """[(label, [(size, busbw), ...]), ...] in the order of the files."""
    series = []
    for index, path in enumerate(paths):
        with open(path) as f:
            record = json.load(f)
        label = labels[index] if index < len(labels) else (
            f"{record.get('benchmark', os.path.basename(path))}"
            f" ({record.get('machine', {}).get('nranks', '?')} ranks)")
        groups = {}
        for row in record.get("rows", []):
            key = (row["type"], row["redop"], row["root"])
            groups.setdefault(key, [])
            if placement == "best":
                values = [row[p]["busbw_gbps"] for p in ("out_of_place", "in_place")]
                values = [v for v in values if v is not None]
                busbw = max(values) if values else None
            else:
                busbw = row[placement]["busbw_gbps"]
            # A log axis has no place for size 0.
            if row["size"] > 0 and busbw is not None:
                groups[key].append((row["size"], busbw))
        varying = [i for i in range(3) if len({key[i] for key in groups}) > 1]
        for key, points in groups.items():
            if not points:
                continue
            suffix = " ".join(f"{('type', 'op', 'root')[i]}={key[i]}" for i in varying)
            series.append((f"{label} {suffix}" if suffix else label, sorted(points)))
    return series


def plot_matplotlib(series, args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(10, 6))
    for label, points in series:
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3,
                label=label)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: size_label(int(round(x)))))
    ax.set_xlabel("size (B)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(args.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)


def gnuplot_text(text):
    return "'" + text.replace("'", "''") + "'"


def plot_gnuplot(series, args):
    gnuplot = shutil.which("gnuplot")
    with tempfile.TemporaryDirectory() as tmp:
        plots = []
        for index, (label, points) in enumerate(series):
            data = os.path.join(tmp, f"series{index}.dat")
            with open(data, "w") as f:
                f.writelines(f"{size} {busbw!r}\n" for size, busbw in points)
            plots.append(f"{gnuplot_text(data)} using 1:2 with linespoints pt 7 ps 0.6 "
                         f"title {gnuplot_text(label)}")
        sizes = sorted({p[0] for _, points in series for p in points})
        sizes = sizes[::max(1, (len(sizes) + 19) // 20)]  # at most 20 labelled tics
        tics = ", ".join(f"{gnuplot_text(size_label(s))} {s}" for s in sizes)
        body = "\n".join([
            f"set output {gnuplot_text(os.path.abspath(args.output))}",
            "set logscale x 2",
            f"set xtics ({tics}) rotate by -45" if tics else "",
            "set xlabel 'size (B)'",
            "set ylabel 'busbw (GB/s)'",
            "set yrange [0:*]",
            f"set title {gnuplot_text(args.title)} noenhanced",
            "set key top left Left reverse noenhanced",
            "set grid",
            "plot " + ", ".join(plots),
        ]) + "\n"
        # pngcairo draws better; the libgd png terminal is the fallback.
        for terminal in ("pngcairo size 1000,600", "png size 1000,600"):
            result = subprocess.run([gnuplot], input=f"set terminal {terminal}\n" + body,
                                    capture_output=True, text=True)
            if (result.returncode == 0 and os.path.exists(args.output)
                    and os.path.getsize(args.output) > 0):
                return
        sys.exit(f"plot_busbw.py: gnuplot failed:\n{result.stderr}")


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", metavar="FILE", help="--json records of the perf tests")
    p.add_argument("-o", "--output", default="busbw.png", help="the PNG to write (busbw.png)")
    p.add_argument("-l", "--label", action="append", default=[],
                   help="label of the next file's line (repeat, in file order)")
    p.add_argument("--placement", choices=["out_of_place", "in_place", "best"],
                   default="out_of_place", help="which busbw column to draw (out_of_place)")
    p.add_argument("--title", default="bus bandwidth")
    p.add_argument("--backend", choices=["auto", "matplotlib", "gnuplot"], default="auto")
    args = p.parse_args()
    if len(args.label) > len(args.files):
        p.error("more --label than files")

    backend = args.backend
    if backend == "auto":
        backend = ("matplotlib" if have_matplotlib()
                   else "gnuplot" if shutil.which("gnuplot") else None)
    if backend is None or (backend == "gnuplot" and not shutil.which("gnuplot")) or (
            backend == "matplotlib" and not have_matplotlib()):
        print("plot_busbw.py: no plotting backend: install gnuplot (Debian: apt-get install "
              "gnuplot-nox) or matplotlib (pip install matplotlib)", file=sys.stderr)
        return NO_BACKEND_EXIT

    try:
        series = load_series(args.files, args.label, args.placement)
    except (OSError, ValueError, KeyError) as error:
        print(f"plot_busbw.py: cannot read the records: {error}", file=sys.stderr)
        return 1
    if not series:
        print("plot_busbw.py: no rows with a size above 0 to plot", file=sys.stderr)
        return 1
    if backend == "matplotlib":
        plot_matplotlib(series, args)
    else:
        plot_gnuplot(series, args)
    print(f"wrote {args.output} ({len(series)} line{'s' if len(series) != 1 else ''})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
