"""The end-to-end benchmark's report as pictures: PNG plots (matplotlib, Agg backend) drawn from
the JSON that ``bench.e2e`` writes, for bench/RESULTS.md and the README.

::

    python3 -m bench.report [--in bench/out/e2e.json] [--out-dir bench/plots]

Each plot is drawn only when its section is in the JSON:

- ``throughput.png`` (section ``throughput``): MB/s and records/s against record size, 1
  producer -> 1 consumer, for mq and every peer, with the same run's raw page-cache write as
  the limit (in the records/s panel, that write's MB/s divided by the record size);
- ``multi.png`` (``multi``): 4 producers -> 4 consumers, mq acks=1 and acks="all" against 4
  ``mp.Queue``s;
- ``latency.png`` (``latency``): end-to-end p50 / p99 / p99.9 against the offered rate, with
  saturated points marked;
- ``latency-kafka.png`` (``latency`` with a Kafka-protocol peer): p50 and p99 of mq, Redis,
  Apache Kafka, mq's Kafka listener and Tansu, one panel each;
- ``latency-strategies.png`` (``latency`` with the spin strategy or mp.Queue): p50 and p99 of
  mq under each wait strategy (blocking, spin, consumer spin only), mp.Queue and ZeroMQ;
- ``fanout.png`` (``fanout``): the broker's CPU per record and the slowest consumer's
  delivery rate with 1 and 4 consumers.

Every figure is the median of the run's repetitions with a min-max bar, on log axes where the
values span decades, in the Okabe-Ito palette (safe for colour-blind readers, each series also
with its own marker), and carries a caption line with the date, the commit, the machine and
how much CPU other processes took during the section.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

# Okabe & Ito (2008), "Color Universal Design": distinguishable with any colour vision.
OKABE_ITO = {"black": "#000000", "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73",
             "yellow": "#F0E442", "blue": "#0072B2", "vermillion": "#D55E00",
             "purple": "#CC79A7"}
# system -> (label, colour, marker)
STYLE = {
    "mq": ("mq (acks=1)", OKABE_ITO["blue"], "o"),
    "mq-all": ('mq (acks="all")', OKABE_ITO["sky"], "s"),
    "mq-acks0": ("mq (acks=0)", OKABE_ITO["sky"], "s"),
    "mq-spin": ("mq (acks=1, spin wait)", OKABE_ITO["green"], "s"),
    "mq-cspin": ("mq (acks=1, consumer spin only)", OKABE_ITO["yellow"], "d"),
    "mp.Queue": ("multiprocessing.Queue (memory only)", OKABE_ITO["orange"], "^"),
    "redis": ("Redis Streams (AOF everysec)", OKABE_ITO["vermillion"], "D"),
    "nats": ("NATS JetStream (file store)", OKABE_ITO["green"], "v"),
    "zmq": ("ZeroMQ PUSH/PULL ipc:// (memory only)", OKABE_ITO["purple"], "P"),
    "sqlite": ("SQLite WAL table (synchronous=NORMAL)", OKABE_ITO["yellow"], "X"),
    # The Kafka-protocol peers, all driven by librdkafka (the palette has eight colours).
    "kafka": ("Apache Kafka (librdkafka, acks=1, page cache)", "#555555", "*"),
    "mq-kafka": ("mq via its Kafka listener (librdkafka, acks=1)", OKABE_ITO["sky"], "h"),
    "tansu": ("Tansu (librdkafka, memory only)", "#999999", "p"),
    "raw": ("raw page-cache write (limit)", OKABE_ITO["black"], None),
}
SIZE_LABELS = {100: "100 B", 1024: "1 KiB", 65536: "64 KiB"}
DPI = 130


def _si(v: float, _pos=None) -> str:
    for div, suf in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suf}"
    return f"{v:.3g}"


def caption(meta: dict, section: str) -> str:
    """Two lines: date, commit and machine; the neighbours' CPU in ``section``."""
    head = (meta.get("git_head") or "?")[:7]
    dirty = " + local changes" if meta.get("git_dirty_files") else ""
    c = meta.get("contention", {}).get(section)
    load = (f"other processes used {c['other_cpus']:.2f} of {meta.get('cpu_count')} CPUs "
            f"during this section" if c else "neighbours' CPU not recorded")
    return (f"{meta.get('date_utc', '?')[:16].replace('T', ' ')} UTC, mq {head}{dirty}; "
            f"{meta.get('cpus_usable')} vCPU {meta.get('cpu_model')}, Linux "
            f"{meta.get('kernel')}, Python {meta.get('python')}\n{load}")


def _finish(fig, meta: dict, section: str, runs: int, path: str,
            how: str = "median of {runs} runs, bars min-max") -> str:
    fig.text(0.01, 0.01, caption(meta, section) + "; " + how.format(runs=runs),
             fontsize=7.5, color="#444444", ha="left", va="bottom")
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _err(s: dict, scale: float = 1.0) -> tuple[float, list[float], list[float]]:
    m = s["median"] * scale
    return m, [m - s["min"] * scale], [s["max"] * scale - m]


def _size_axis(ax, sizes: list[int]) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: SIZE_LABELS.get(int(v), f"{v:g}")))
    ax.set_xlim(sizes[0] / 1.8, sizes[-1] * 1.8)
    ax.set_xlabel("record (value) size")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(_si))
    ax.grid(True, which="major", color="#dddddd", linewidth=0.6)


def plot_throughput(res: dict, out_dir: str) -> str:
    tp, meta = res["throughput"], res["meta"]
    sizes_by_label = {label: e["size"] for label, e in tp["sizes"].items()}
    sizes = sorted(sizes_by_label.values())
    systems = [s for s in STYLE if s != "raw" and all(
        s in e["rate"] for e in tp["sizes"].values())]
    fig, (ax_mb, ax_rec) = plt.subplots(1, 2, figsize=(12.5, 5.6))
    for ax, key, unit in ((ax_mb, "mb_s", "MB/s of values"), (ax_rec, "rate", "records/s")):
        for s in systems:
            label, colour, marker = STYLE[s]
            pts = sorted((e["size"], *_err(e[key][s])) for e in tp["sizes"].values())
            xs = [p[0] for p in pts]
            ax.errorbar(xs, [p[1] for p in pts],
                        yerr=[[p[2][0] for p in pts], [p[3][0] for p in pts]],
                        color=colour, marker=marker, markersize=6.5, capsize=3,
                        linewidth=2.6 if s == "mq" else 1.4, label=label,
                        markeredgecolor="black" if s == "sqlite" else colour,
                        zorder=3 if s == "mq" else 2)
        raw = sorted((e["size"], e["mb_s"]["raw"]["median"]) for e in tp["sizes"].values())
        scale = (lambda size: 1.0) if key == "mb_s" else (lambda size: 1e6 / size)
        ax.plot([x for x, _ in raw], [v * scale(x) for x, v in raw], color="black",
                linestyle="--", linewidth=1.3, label=STYLE["raw"][0], zorder=1)
        _size_axis(ax, sizes)
        ax.set_ylabel(unit + " (log scale)")
        if key == "mb_s":
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:,.0f}"))
    ax_mb.set_title("MB/s: 1 producer -> 1 consumer")
    ax_rec.set_title("records/s: 1 producer -> 1 consumer")
    handles, labels = ax_mb.get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=4, fontsize=8.5, frameon=False,
               bbox_to_anchor=(0.5, 0.93))
    fig.suptitle("Throughput against record size: mq and its peers, same box, same run",
                 fontsize=13, y=0.985)
    fig.subplots_adjust(left=0.07, right=0.985, top=0.77, bottom=0.16, wspace=0.22)
    return _finish(fig, meta, "throughput", res["params"]["runs"],
                   os.path.join(out_dir, "throughput.png"))


def plot_multi(res: dict, out_dir: str) -> str:
    mu, meta = res["multi"], res["meta"]
    sides = [("mq", "mq\nacks=1"), ("mq-all", 'mq\nacks="all"'),
             ("mp.Queue", "4 x\nmultiprocessing.Queue")]
    labels = list(mu["sizes"])
    fig, axes = plt.subplots(1, len(labels), figsize=(10, 5.2), squeeze=False)
    for ax, label in zip(axes[0], labels, strict=True):
        e = mu["sizes"][label]
        for i, (side, _name) in enumerate(sides):
            colour = STYLE[side][1]
            m, lo, hi = _err(e["rate"][side])
            ax.bar(i, m, yerr=[lo, hi], color=colour, capsize=4, edgecolor="black",
                   linewidth=0.6, hatch="//" if side == "mq-all" else None)
            ax.text(i, m * 1.04 + hi[0], f"{_si(m)}/s\n{e['mb_s'][side]['median']:.0f} MB/s",
                    ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(sides)), [n for _, n in sides], fontsize=8.5)
        ax.set_title(f"{SIZE_LABELS.get(e['size'], label)} values")
        ax.set_ylabel("records/s, all 4 consumers together")
        ax.yaxis.set_major_formatter(FuncFormatter(_si))
        ax.set_ylim(0, max(e["rate"][s]["max"] for s, _ in sides) * 1.3)
        ax.grid(True, axis="y", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
    fig.suptitle("4 producers -> 4 consumers (4 partitions; mp.Queue: 4 queues)", fontsize=12)
    fig.subplots_adjust(left=0.09, right=0.98, top=0.86, bottom=0.2, wspace=0.3)
    return _finish(fig, meta, "multi", res["params"]["runs"],
                   os.path.join(out_dir, "multi.png"))


def plot_latency(res: dict, out_dir: str) -> str:
    lt, meta = res["latency"], res["meta"]
    rates = sorted(int(r) for r in lt["rates"])
    systems = [s for s in ("mq", "mq-acks0", "redis") if s in lt["rates"][str(rates[0])]]
    pcts = [("p50_us", "p50", "-"), ("p99_us", "p99", "--"), ("p99_9_us", "p99.9", ":")]
    fig, ax = plt.subplots(figsize=(9, 5.8))
    for s in systems:
        label, colour, marker = STYLE[s]
        for key, pname, ls in pcts:
            ys = [lt["rates"][str(r)][s]["merged"][key] for r in rates]
            ax.plot(rates, ys, color=colour, linestyle=ls, marker=marker, markersize=6,
                    linewidth=2.2 if s == "mq" else 1.4, label=f"{label} {pname}")
        for r in rates:
            e = lt["rates"][str(r)][s]
            if 2 * e["saturated_runs"] > len(lt["rates"][str(r)]["runs"][s]):
                y = e["merged"]["p50_us"]
                ax.annotate(f"saturated: {_si(e['achieved_rate']['median'])}/s achieved",
                            (r, y), textcoords="offset points", xytext=(-175, -22),
                            fontsize=8, color=colour,
                            arrowprops={"arrowstyle": "->", "color": colour})
    _latency_axes(ax, rates)
    ax.set_xlabel("offered load, 100 B messages (open loop, 1 producer -> 1 consumer)")
    ax.set_ylabel("end-to-end latency: receive - intended send (log scale)")
    ax.grid(True, which="major", color="#dddddd", linewidth=0.6)
    ax.legend(fontsize=8, ncol=len(systems), loc="upper center", frameon=False,
              bbox_to_anchor=(0.5, -0.13))
    ax.set_title("End-to-end latency percentiles against offered load\n"
                 "(coordinated-omission corrected; histograms of all runs merged)",
                 fontsize=11.5)
    fig.subplots_adjust(left=0.12, right=0.97, top=0.88, bottom=0.32)
    return _finish(fig, meta, "latency", res["params"]["runs"],
                   os.path.join(out_dir, "latency.png"),
                   "the {runs} runs' histograms merged per point")


def _latency_axes(ax, rates: list[int]) -> None:
    """Log-log axes of latency against the offered rates, ticks at the rates."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(FixedLocator(rates))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{_si(v)}/s"))
    ax.set_xlim(rates[0] / 1.6, rates[-1] * 1.6)
    ax.yaxis.set_major_formatter(FuncFormatter(
        lambda v, _p: f"{v / 1e6:g} s" if v >= 1e6 else f"{v / 1000:g} ms" if v >= 1000
        else f"{v:g} µs"))


KAFKA_PEERS = ("kafka", "mq-kafka", "tansu")
WAIT_STRATEGIES = ("mq", "mq-spin", "mq-cspin")


def plot_latency_peers(res: dict, out_dir: str) -> str:
    """p50 and p99 against the offered rate for mq, Redis and the Kafka-protocol peers."""
    return _latency_panels(res, ("mq", "redis", *KAFKA_PEERS),
                           "End-to-end latency: mq, Redis and the Kafka-protocol peers",
                           os.path.join(out_dir, "latency-kafka.png"))


def plot_latency_strategies(res: dict, out_dir: str) -> str:
    """p50 and p99 against the offered rate for mq under each wait strategy, mp.Queue and
    ZeroMQ."""
    return _latency_panels(res, (*WAIT_STRATEGIES, "mp.Queue", "zmq"),
                           "End-to-end latency: mq's wait strategies, mp.Queue and ZeroMQ",
                           os.path.join(out_dir, "latency-strategies.png"))


def _latency_panels(res: dict, names: tuple[str, ...], title: str, path: str) -> str:
    """p50 and p99 against the offered rate for the systems ``names`` that ran, one panel
    each; a point where the system fell behind the offered rate is drawn hollow."""
    lt, meta = res["latency"], res["meta"]
    rates = sorted(int(r) for r in lt["rates"])
    systems = [s for s in names if s in lt["rates"][str(rates[0])]]
    fig, axes = plt.subplots(1, 2, figsize=(11, 5.6), sharey=True)
    for ax, (key, pname) in zip(axes, (("p50_us", "p50"), ("p99_us", "p99")), strict=True):
        for s in systems:
            label, colour, marker = STYLE[s]
            es = [lt["rates"][str(r)] for r in rates]
            ys = [e[s]["merged"][key] for e in es]
            ax.plot(rates, ys, color=colour, marker=marker, markersize=7,
                    linewidth=2.4 if s == "mq" else 1.4, label=label)
            for r, e, y in zip(rates, es, ys, strict=True):
                if 2 * e[s]["saturated_runs"] > len(e["runs"][s]):
                    ax.plot([r], [y], marker=marker, markersize=12, markerfacecolor="white",
                            color=colour, linestyle="none")
        _latency_axes(ax, rates)
        ax.set_title(f"{pname}, histograms of all runs merged", fontsize=10.5)
        ax.set_xlabel("offered load, 100 B, open loop")
        ax.grid(True, which="major", color="#dddddd", linewidth=0.6)
    axes[0].set_ylabel("receive - intended send (log scale)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=3, fontsize=8.5, frameon=False,
               bbox_to_anchor=(0.5, 0.925))
    fig.suptitle(f"{title} (hollow: fell behind the offered rate)", fontsize=12, y=0.985)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.76, bottom=0.19, wspace=0.08)
    return _finish(fig, meta, "latency", res["params"]["runs"], path,
                   "the {runs} runs' histograms merged per point")


def plot_fanout(res: dict, out_dir: str) -> str:
    fo, meta = res["fanout"], res["meta"]
    ks = ["1", "4"]
    fig, (ax_cpu, ax_del) = plt.subplots(1, 2, figsize=(10, 5))
    colours = [OKABE_ITO["blue"], OKABE_ITO["sky"]]
    # Left: what 4 consumers cost the broker against 1, flat out and paced.
    ratios = [("flat out\n(2 CPUs saturated)", fo["cpu_ratio"])]
    if fo.get("paced"):
        ratios.append((f"paced at {fo['paced']['rate'] / 1e3:.0f} k rec/s\n(CPU to spare)",
                       fo["paced"]["cpu_ratio"]))
    for i, (_, r) in enumerate(ratios):
        m, lo, hi = _err(r)
        ax_cpu.bar(i, m, yerr=[lo, hi], color=colours[i], edgecolor="black", linewidth=0.6,
                   capsize=4)
        ax_cpu.text(i, m + hi[0], f"{m:.2f}x", ha="center", va="bottom", fontsize=9)
    ax_cpu.axhline(1.0, color=OKABE_ITO["vermillion"], linestyle="--", linewidth=1)
    ax_cpu.text(-0.45, 1.0, "goal <= 1x", color=OKABE_ITO["vermillion"], ha="left",
                va="bottom", fontsize=8.5)
    ax_cpu.set_xticks(range(len(ratios)), [label for label, _ in ratios])
    ax_cpu.set_title("broker CPU with 4 consumers / with 1", fontsize=10)
    ax_cpu.set_ylabel("ratio of broker on-CPU seconds")
    for i, k in enumerate(ks):
        m, lo, hi = _err(fo["delivery_min"][k])
        ax_del.bar(i, m, yerr=[lo, hi], color=colours[i], edgecolor="black", linewidth=0.6,
                   capsize=4)
        ax_del.text(i, m + hi[0], f"{_si(m)}/s", ha="center", va="bottom", fontsize=9)
    ax_del.set_title("flat out: delivery rate of the slowest consumer", fontsize=10)
    ax_del.set_ylabel("records/s per consumer")
    ax_del.yaxis.set_major_formatter(FuncFormatter(_si))
    ax_del.set_xticks(range(len(ks)), [f"1 producer -> {k} consumer{'s' if k != '1' else ''}"
                                       for k in ks])
    for ax in (ax_cpu, ax_del):
        ax.grid(True, axis="y", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.12)
    fig.suptitle(f"Fan-out: every consumer reads the same partition from the map "
                 f"({fo['value_size']} B records)", fontsize=12)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.84, bottom=0.2, wspace=0.28)
    return _finish(fig, meta, "fanout", res["params"]["runs"],
                   os.path.join(out_dir, "fanout.png"))


PLOTS = {"throughput": plot_throughput, "multi": plot_multi, "latency": plot_latency,
         "fanout": plot_fanout}


def draw(res: dict, out_dir: str) -> list[str]:
    """Every plot whose section is in ``res``; returns the paths written."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [fn(res, out_dir) for name, fn in PLOTS.items() if res.get(name)]
    lt = res.get("latency")
    if lt and any(s in e for e in lt["rates"].values() for s in KAFKA_PEERS):
        paths.append(plot_latency_peers(res, out_dir))
    if lt and any(s in e for e in lt["rates"].values() for s in ("mq-spin", "mp.Queue")):
        paths.append(plot_latency_strategies(res, out_dir))
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m bench.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--in", dest="inp", default="bench/out/e2e.json",
                   help="the JSON bench.e2e wrote")
    p.add_argument("--out-dir", default="bench/plots", help="where the PNGs go")
    args = p.parse_args(argv)
    with open(args.inp) as f:
        res = json.load(f)
    paths = draw(res, args.out_dir)
    if not paths:
        print(f"{args.inp}: no section to plot", file=sys.stderr)
        return 1
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
