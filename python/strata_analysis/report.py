"""strata-report FILE... : markdown summary tables and PNG plots of Strata results files.

Writes report.md and *.png into --out (default: a folder beside the first file) and prints the markdown.
Figures state their units and conventions: times are medians over iterations of the per-iteration max
over ranks unless a label says otherwise; FLOP/s use the FLOP count stored with each case.
"""
from __future__ import annotations

import argparse
import os
import sys

import matplotlib  # noqa: E402
import matplotlib.patches  # noqa: E402,F401

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from strata_analysis import results as sr  # noqa: E402

FIGSIZE = (8, 5)
DPI = 100  # 800 x 500 pixels


def markdown_table(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    rows = ["| " + " | ".join(str(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *rows])


def percent_of_peak(fraction: pd.Series, decimals: int = 1) -> pd.Series:
    """A fraction of peak as a percentage: "n/a" where the peak is unknown (0 or NaN), and a figure above 100 %,
    which cannot be true (a wrong peak or FLOP count), marked "!" as the programs print it."""
    def text(f: float) -> str:
        if not f > 0:
            return "n/a"
        return f"{100 * f:.{decimals}f}" + ("!" if f > 1 else "")
    return pd.Series(fraction, dtype=float).map(text)


def gemm_section(data: pd.DataFrame, out_dir: str) -> tuple[str, list[str]]:
    table = pd.DataFrame({
        "run": data["run_id"].str.slice(0, 15),
        "backend": data["backend"],
        "dtype": data["dtype"],
        "shape (MxNxK)": data["m"].astype(str) + "x" + data["n"].astype(str) + "x" + data["k"].astype(str),
        "source": data["shape_source"],
        "ranks": data["n_ranks"],
        "time median (ms)": (data["time_rankmax_median"] * 1e3).map("{:.3f}".format),
        "GFLOP/s per rank": (data["flop_rate_per_rank"] / 1e9).map("{:.1f}".format),
        "GFLOP/s all ranks": (data["flop_rate_aggregate"] / 1e9).map("{:.1f}".format),
        "% of peak": percent_of_peak(np.where(data["peak_per_rank"] > 0, data["peak_fraction"], 0)),
        "check": np.where(data["wrong_elements"] == 0, "ok", "FAIL"),
    })
    text = ["## GEMM (strata-gemm)", "",
            "FLOPs = 2MNK. Time: median over iterations of the per-iteration max over ranks. GFLOP/s per rank: "
            "2MNK / median of the per-iteration mean over ranks; all ranks: ranks x 2MNK / median of the max.",
            "", markdown_table(table), ""]
    peaks = data.loc[data["peak_per_rank"] > 0, ["dtype", "peak_per_rank", "peak_source"]].drop_duplicates("dtype")
    for row in peaks.itertuples(index=False):
        text.append(f"- peak per rank, {row.dtype}: {row.peak_per_rank / 1e9:.1f} GFLOP/s ({row.peak_source})")
    text.append("")

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    labels = [f"{m}x{n}x{k}" for m, n, k in zip(data["m"], data["n"], data["k"])]
    order = list(dict.fromkeys(labels))
    for (backend, dtype), group in data.groupby(["backend", "dtype"], sort=False):
        xs = [order.index(f"{m}x{n}x{k}") for m, n, k in zip(group["m"], group["n"], group["k"])]
        line, = ax.plot(xs, group["flop_rate_per_rank"] / 1e9, "o-", label=f"{backend} {dtype}")
        peak = group["peak_per_rank"].max()
        if peak > 0:
            ax.axhline(peak / 1e9, color=line.get_color(), linestyle="--", linewidth=1,
                       label=f"{backend} {dtype} peak per rank")
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels(order, rotation=30, ha="right", fontsize=8)
    ax.set_xlabel("shape M x N x K")
    ax.set_ylabel("GFLOP/s per rank (1e9 FLOP/s; FLOP = 2MNK)")
    ax.set_title("GEMM throughput per rank (median over iterations, mean over ranks)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "gemm_flops.png")
    fig.savefig(path)
    plt.close(fig)
    return "\n".join(text), [path]


def collective_section(data: pd.DataFrame, out_dir: str) -> tuple[str, list[str]]:
    data = data.copy()
    table = pd.DataFrame({
        "operation": data["operation"], "algo": data["algo"], "group": data["group_kind"],
        "nodes": data["n_nodes"], "mode": data["mode"], "dtype": data["dtype"], "place": np.where(data["in_place"] == 1, "in", "out"),
        "size S (B)": data["size_bytes"].astype(int), "time median (us)": (data["time_rankmax_median"] * 1e6).map("{:.2f}".format),
        "algbw (GB/s)": (data["algbw"] / 1e9).map("{:.3f}".format), "busbw (GB/s)": (data["busbw"] / 1e9).map("{:.3f}".format),
        "check": np.where(data["wrong_elements"] == 0, "ok", "FAIL"),
    })
    text = ["## Collectives (strata-collective)", "",
            "S as nccl-tests defines it per operation; time: median over iterations of the per-iteration max over "
            "ranks; algbw = S / time; busbw = algbw x nccl-tests factor (allreduce 2(n-1)/n; allgather, "
            "reduce_scatter, alltoall (n-1)/n; else 1); GB/s = 1e9 B/s.", "", markdown_table(table), ""]
    paths = []
    data["series"] = (data["algo"] + " " + data["group_kind"] + " " + data["n_nodes"].astype(str) + "n"
                      + np.where(data["in_place"] == 1, " in", " out"))
    operations = list(dict.fromkeys(data["operation"]))
    columns, rows = 4, 2  # room for all seven operations; a fixed size keeps reports comparable
    for metric, ylabel, name, scale in (("busbw", "busbw (GB/s = 1e9 B/s)", "collective_busbw.png", 1e-9),
                                        ("time_rankmax_median", "time (us)", "collective_latency.png", 1e6)):
        fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3.2 * rows), dpi=DPI, squeeze=False)
        for ax, operation in zip(axes.flat, operations):
            subset = data[(data["operation"] == operation) & (data["size_bytes"] > 0)]
            for series, group in subset.groupby("series", sort=False):
                group = group.sort_values("size_bytes")
                ax.plot(group["size_bytes"], group[metric] * scale, "o-", markersize=3, label=series)
            ax.set_xscale("log", base=2)
            if metric != "busbw":
                ax.set_yscale("log")
            ax.set_title(operation, fontsize=10)
            ax.set_xlabel("size S (B, nccl-tests)", fontsize=8)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6)
        for ax in list(axes.flat)[len(operations):]:
            ax.axis("off")
        fig.suptitle(("Bus bandwidth (nccl-tests factor)" if metric == "busbw" else "Latency")
                     + " against size; median over iterations of the per-iteration max over ranks", fontsize=10)
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)
    return "\n".join(text), paths


def attention_section(data: pd.DataFrame, out_dir: str) -> tuple[str, list[str]]:
    table = pd.DataFrame({
        "impl": data["impl"], "pass": data["pass"], "causal": np.where(data["causal"] == 1, "yes", "no"),
        "dtype": data["dtype"], "B": data["batch"], "Hq/Hkv": data["heads_q"].astype(str) + "/" + data["heads_kv"].astype(str),
        "Sq/Skv": data["seq_q"].astype(str) + "/" + data["seq_kv"].astype(str), "D": data["head_dim"],
        "time median (ms)": (data["time_rankmax_median"] * 1e3).map("{:.3f}".format),
        "GFLOP/s per rank": (data["flop_rate_per_rank"] / 1e9).map("{:.1f}".format),
        "% of peak": percent_of_peak(data["peak_fraction"]),
        "rel. L2 error": data["check_rel_l2"].map("{:.1e}".format),
    })
    text = ["## Attention (strata-attention)", "",
            "FLOPs: flash-attention convention (forward 4 b h s_q s_kv d, half when causal; backward 2.5x forward). "
            "GFLOP/s per rank from the median of the per-iteration mean over ranks; error against float64.", "",
            markdown_table(table), ""]
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    for (impl, pas, causal, dim), group in data.groupby(["impl", "pass", "causal", "head_dim"], sort=False):
        group = group.sort_values("seq_kv")
        ax.plot(group["seq_kv"], group["flop_rate_per_rank"] / 1e9, "o-",
                label=f"{impl} {pas}{' causal' if causal else ''} d={dim}")
    peak = data["peak_per_rank"].max()
    if peak > 0:
        ax.axhline(peak / 1e9, color="black", linestyle="--", linewidth=1, label="peak per rank")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("key/value sequence length")
    ax.set_ylabel("GFLOP/s per rank (flash-attention FLOP convention)")
    ax.set_title("Attention throughput per rank")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = os.path.join(out_dir, "attention_flops.png")
    fig.savefig(path)
    plt.close(fig)
    return "\n".join(text), [path]


# The step's phases as stacked bars that add up to the step: backward without its on-demand recomputation, the
# recomputation on the critical path (on demand, and in windows after the awaited gradient came) and hidden (in
# windows before it came, in time the rank would have waited), and the waits split into the pipeline's, the
# tensor-parallel collectives' and the data-parallel ones'. (label, colour, hatch, values from the step data)
STEP_BARS = [
    ("forward", "tab:blue", "", lambda c: c("phase_forward")),
    ("backward", "tab:orange", "", lambda c: c("phase_backward") - c("phase_recompute")),
    ("recompute on demand", "tab:red", "", lambda c: c("phase_recompute")),
    ("recompute in window, after the gradient", "tab:pink", "",
     lambda c: (c("phase_recompute_window") - c("phase_recompute_hidden")).clip(lower=0)),
    ("recompute in window, hidden", "tab:purple", "//", lambda c: c("phase_recompute_hidden")),
    ("optimizer", "tab:green", "", lambda c: c("phase_optimizer")),
    ("pipeline wait", "tab:gray", "", lambda c: c("phase_pipeline_wait")),
    ("tensor-parallel comm", "tab:olive", "", lambda c: c("phase_comm_tp")),
    ("data-parallel comm exposed", "tab:brown", "",
     lambda c: (c("phase_comm_exposed") - c("phase_pipeline_wait") - c("phase_comm_tp")).clip(lower=0)),
    ("idle", "lightgray", "", lambda c: c("phase_idle")),
]
MEMORY_CATEGORIES = ["parameters", "gradients", "optimizer", "activations", "workspace", "comm_buffers"]


def _save(fig, out_dir: str, name: str) -> str:
    fig.tight_layout()
    path = os.path.join(out_dir, name)
    fig.savefig(path)
    plt.close(fig)
    return path


def step_timeline_plot(path: str, run_id: str, case: int, label: str, out_dir: str) -> str | None:
    """One recorded step of one case: a lane per rank and stream on the common clock."""
    events = sr.read_run_table(path, run_id, "events", where={"case": case})
    if events.empty:
        return None
    events = events[events["iteration"] == events["iteration"].min()]
    t0 = events["start"].min()
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    colours = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green",
               "intra": "tab:purple", "inter": "tab:red", "global": "tab:brown"}
    lanes = []
    for (rank, stream), group in events.groupby(["rank", "stream"], sort=True):
        y = len(lanes)
        lanes.append(f"rank {rank} {stream}")
        for row in group.itertuples(index=False):
            key = row.group if row.stream == "comm" else row.operation.split(" ")[0]  # "forward mb 1 stage 0"
            ax.broken_barh([((row.start - t0) * 1e3, max((row.end - row.start) * 1e3, 1e-3))], (y - 0.4, 0.8),
                           color=colours.get(key, "tab:gray"))
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes, fontsize=7)
    ax.set_xlabel("ms from the step's first event (common clock: rank 0's, offsets measured at the start)")
    ax.set_title(f"One step's timeline: {label}")
    handles = [matplotlib.patches.Patch(color=c, label=k) for k, c in colours.items()]
    ax.legend(handles=handles, fontsize=7, ncol=3)
    return _save(fig, out_dir, "step_timeline.png")


PIPELINE_COLOURS = {  # the pipelined timeline: compute on a rank's lane, transfers as thin bars beside it
    "forward": "tab:blue", "backward": "tab:orange", "recompute on demand": "tab:red",
    "recompute in a window": "tab:purple", "optimizer": "tab:green",
    "send activations": "tab:cyan", "send gradients": "tab:pink", "recv activations": "tab:olive",
    "recv gradients": "tab:brown", "tensor-parallel": "black", "data-parallel": "dimgray",
}


def _pipeline_kind(operation: str, stream: str, group: str) -> str:
    """The legend entry of a timeline event: "forward mb 3 stage 1", "recompute 4" (on demand, inside a
    backward), "recompute mb 2 L5 post" (in a window), "send activations mb 1 stage 0" (group pp), ..."""
    if stream == "comm":
        if group == "pp":
            return " ".join(operation.split(" ")[:2])
        return "tensor-parallel" if group == "tp" else "data-parallel"
    if operation.startswith("recompute mb "):
        return "recompute in a window"
    if operation.startswith("recompute"):
        return "recompute on demand"
    return operation.split(" ")[0]


def pipeline_ranks(path: str, run_id: str, case: int) -> dict[int, int]:
    """Each rank's pipeline rank (stage), from the `pipeline_rank` metric; every rank stage 0 without it."""
    metrics = sr.read_run_table(path, run_id, "metrics", where={"case": case, "metric": "pipeline_rank"})
    return {int(r): int(v) for r, v in zip(metrics["rank"], metrics["value"])}


def pipeline_timeline_plot(path: str, run_id: str, case: int, label: str, out_dir: str) -> str | None:
    """One pipelined step: a lane per rank (ordered by stage), its forwards (F<micro-batch>), backwards
    (B<micro-batch>), recomputation on demand and in windows and the optimizer on it; above it the sends to
    other stages, below it the receives (from when they were posted to when the rank saw them done) and the
    tensor- and data-parallel collectives."""
    events = sr.read_run_table(path, run_id, "events", where={"case": case})
    if events.empty:
        return None
    events = events[events["iteration"] == events["iteration"].min()]
    stages = pipeline_ranks(path, run_id, case)
    ranks = sorted(set(events["rank"]), key=lambda r: (stages.get(int(r), 0), r))
    t0 = events["start"].min()
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    order = {"backward": 0, "forward": 0, "optimizer": 0, "recompute on demand": 1, "recompute in a window": 1}
    events = events.assign(kind=[_pipeline_kind(o, s, g) for o, s, g in zip(events["operation"], events["stream"], events["group"])])
    events = events.assign(layer=events["kind"].map(order).fillna(2)).sort_values(["layer", "start"])
    for row in events.itertuples(index=False):
        y = ranks.index(row.rank)
        start, width = (row.start - t0) * 1e3, max((row.end - row.start) * 1e3, 1e-3)
        colour = PIPELINE_COLOURS.get(row.kind, "lightgray")
        if row.stream == "compute":
            band = (y - 0.28, 0.56) if row.layer == 0 else (y - 0.18, 0.36)
            ax.broken_barh([(start, width)], band, color=colour, edgecolor="white", linewidth=0.3)
            words = row.operation.split(" ")
            if row.kind in ("forward", "backward") and len(words) > 2 and words[1] == "mb":
                ax.text(start + width / 2, y, f"{row.kind[0].upper()}{words[2]}", ha="center", va="center", fontsize=5,
                        color="white", clip_on=True)
        elif row.kind.startswith("send"):  # the y axis is inverted: y - d is above the lane
            ax.broken_barh([(start, width)], (y - 0.41, 0.1), color=colour)
        elif row.kind.startswith("recv"):
            ax.broken_barh([(start, width)], (y + 0.31, 0.1), color=colour)
        else:
            ax.broken_barh([(start, width)], (y + 0.42, 0.05), color=colour)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r} (stage {stages.get(int(r), 0)})" for r in ranks], fontsize=7)
    ax.set_ylim(len(ranks) - 0.4, -0.6)  # rank 0 at the top
    ax.set_xlabel("ms from the step's first event (common clock: rank 0's, offsets measured at the start)")
    ax.set_title(f"One pipelined step: {label}\n(above a lane: sends to other stages; below: receives, posted to seen done)",
                 fontsize=9)
    present = set(events["kind"])
    handles = [matplotlib.patches.Patch(color=c, label=k) for k, c in PIPELINE_COLOURS.items() if k in present]
    ax.legend(handles=handles, fontsize=6, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.12), frameon=False)
    return _save(fig, out_dir, "step_pipeline_timeline.png")


def pipeline_part(data: pd.DataFrame, labels: list[str], column, out_dir: str) -> tuple[str, list[str]]:
    """The pipelined cases side by side: bubble against the formula, recomputation on the critical path and
    hidden, bytes to other stages, memory per stage; and one pipelined step's timeline."""
    piped = [i for i in range(len(data)) if column("pp", 1)[i] > 1]
    step = data["time_rankmax_median"]

    def ms(name):
        return (1e3 * column(name)).map("{:.2f}".format)

    def fraction(name):
        return column(name, np.nan).map(lambda v: "n/a" if np.isnan(v) else f"{v:.4f}")

    def mbytes(name):
        return (column(name, np.nan) / 1e6).map(lambda v: "n/a" if np.isnan(v) else f"{v:.3f}")

    table = pd.DataFrame({
        "case": labels, "stages (p)": column("pp", 1).astype(int), "schedule": column("schedule", ""),
        "chunks (v)": column("virtual_stages", 1).astype(int), "micro-batches (m)": column("accumulation", 1).astype(int),
        "stage layers": column("stage_layers", ""),
        "step (ms)": (step * 1e3).map("{:.2f}".format), "pipeline wait (ms)": ms("phase_pipeline_wait"),
        "bubble": fraction("bubble_fraction"), "(p-1)/(v m)": fraction("bubble_fraction_formula"),
        "recompute critical path (ms)": ms("recompute_exposed"), "recompute hidden (ms)": ms("phase_recompute_hidden"),
        "sent to stages MB (formula)": mbytes("sent_pipeline") + " (" + mbytes("sent_pipeline_formula") + ")",
        "HFU % / MFU %": percent_of_peak(column("hfu", np.nan), 2) + " / " + percent_of_peak(column("mfu"), 2),
    }).iloc[piped]
    text = ["### Pipeline: schedules and recomputation modes side by side", "",
            "Bubble: each rank's pipeline wait over its compute in the pipelined passes (forward + backward + "
            "recomputation in windows), median step, mean over ranks, beside (p - 1) / (v m) (uniform stages, free "
            "transfers). Recomputation on the critical path: on demand, plus the part of a window's that ran after the "
            "awaited gradient came; hidden: the part before. Times: median over steps, mean over ranks; bytes sent to "
            "other stages per rank per step (mean over ranks) beside the formula; HFU counts the recomputed FLOPs.", "",
            markdown_table(table), ""]
    plots = []
    x = np.arange(len(piped))
    names = [labels[i] for i in piped]

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    ax.bar(x - 0.2, column("bubble_fraction", np.nan).iloc[piped], 0.4, color="tab:gray", label="measured")
    ax.bar(x + 0.2, column("bubble_fraction_formula", np.nan).iloc[piped], 0.4, color="tab:gray", hatch="//", alpha=0.5,
           label="(p - 1) / (v m)")
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("pipeline wait / compute of the passes (1)")
    ax.set_title("Pipeline bubble: measured (median step, mean over ranks) against the formula", fontsize=10)
    ax.legend(fontsize=8)
    plots.append(_save(fig, out_dir, "step_bubble.png"))

    # Memory per stage: each category's high-water mark, the max over the ranks of the stage.
    rows = []
    for i in piped:
        r = data.iloc[i]
        memory = sr.read_run_table(r["file"], r["run_id"], "memory", where={"case": int(r["case"])})
        stages = pipeline_ranks(r["file"], r["run_id"], int(r["case"]))
        memory = memory.assign(stage=[stages.get(int(k), 0) for k in memory["rank"]])
        for stage, group in memory.groupby("stage"):
            rows.append({"case": labels[i], "stage": stage,
                         **group.groupby("category")["bytes"].max().reindex(MEMORY_CATEGORIES).fillna(0).to_dict()})
    if rows:
        stage_memory = pd.DataFrame(rows)
        fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
        bars = np.arange(len(stage_memory))
        bottom = np.zeros(len(stage_memory))
        for k, category in enumerate(MEMORY_CATEGORIES):
            values = stage_memory[category].to_numpy(dtype=float) / 2**20
            ax.bar(bars, values, bottom=bottom, color=f"C{k}", label=category)
            bottom += values
        ax.set_xticks(bars)
        ax.set_xticklabels([f"{c} | stage {s}" for c, s in zip(stage_memory["case"], stage_memory["stage"])], rotation=45,
                           ha="right", fontsize=7)
        ax.set_ylabel("MiB per rank (high-water, max over the stage)")
        ax.set_title("Memory per pipeline stage by category", fontsize=10)
        ax.legend(fontsize=7)
        plots.append(_save(fig, out_dir, "step_stage_memory.png"))
        shown = stage_memory.assign(**{c: (stage_memory[c] / 1e6).map("{:.3f}".format) for c in MEMORY_CATEGORIES})
        text += ["Memory per pipeline stage (MB, high-water mark, max over the stage's ranks): early stages of 1F1B hold "
                 "more micro-batches in flight.", "", markdown_table(shown), ""]

    # One pipelined step: the last overlapped case (recomputation in windows shows), else the last pipelined one.
    modes = column("recompute", "none")
    chosen = ([i for i in piped if modes[i] == "overlap"] or piped)[-1]
    r = data.iloc[chosen]
    timeline = pipeline_timeline_plot(r["file"], r["run_id"], int(r["case"]), labels[chosen], out_dir)
    if timeline:
        plots.append(timeline)
    return "\n".join(text), plots


def step_section(data: pd.DataFrame, out_dir: str) -> tuple[str, list[str]]:
    data = data.reset_index(drop=True)
    several_runs = data["run_id"].nunique() > 1

    def column(name, default=0.0):
        """A column of the cases, with `default` where a file from before it existed has none."""
        if name not in data:
            return pd.Series([default] * len(data), index=data.index)
        return data[name].fillna(default) if default is not None else data[name]

    # Files from before recomputation existed have no such columns: every case kept its activations; from before
    # pipeline parallelism, every case ran one stage.
    recompute = column("recompute", "none")
    tp, pp = column("tp", 1).astype(int), column("pp", 1).astype(int)
    schedule, chunks = column("schedule", ""), column("virtual_stages", 1).astype(int)

    def grid(i):
        parts = [f"tp{tp[i]}"] if tp[i] > 1 else []
        if pp[i] > 1:
            parts.append(f"pp{pp[i]} {schedule[i]}" + (f" v{chunks[i]}" if chunks[i] > 1 else ""))
        return "".join(f" {p}" for p in parts)

    labels = [f"{r.strategy}{grid(i)}" + (f" {mode}" if mode != "none" else "") + (f" ({r.run_id[-6:]})" if several_runs else "")
              for i, (r, mode) in enumerate(zip(data.itertuples(), recompute))]
    step = data["time_rankmax_median"]

    def mb(values):
        return (values / 1e6).map(lambda v: "n/a" if np.isnan(v) else f"{v:.3f}")

    states = data["memory_parameters"] + data["memory_gradients"] + data["memory_optimizer"]
    states_formula = data["memory_parameters_formula"] + data["memory_gradients_formula"] + data["memory_optimizer_formula"]
    table = pd.DataFrame({
        "strategy": labels, "model": data["model"], "ranks (g x m)": data["groups"].astype(str) + " x " + data["group_size"].astype(str),
        "step (ms)": (step * 1e3).map("{:.2f}".format), "tokens/s": data["tokens_per_s"].map("{:.0f}".format),
        "MFU %": percent_of_peak(data["mfu"], 2),
        "HFU %": percent_of_peak(data["hfu"], 2) if "hfu" in data else "n/a",
        "recompute (ms)": (1e3 * data["phase_recompute"]).map("{:.2f}".format) if "phase_recompute" in data else "n/a",
        "activations MB (formula)": mb(data["memory_activations"]) + " (" + mb(data["memory_activations_formula"]) + ")",
        "exposed comm %": (100 * data["phase_comm_exposed"] / step).map("{:.1f}".format),
        "model states MB (formula)": mb(states) + " (" + mb(states_formula) + ")",
        "sent intra MB (formula)": mb(data["sent_intra"]) + " (" + mb(data["sent_intra_formula"]) + ")",
        "sent inter MB (formula)": mb(data["sent_inter"]) + " (" + mb(data["sent_inter_formula"]) + ")",
    })
    def memory_ratio(category):
        # Files from before the ratio was stored: the same quotient from the two columns beside it.
        if f"memory_{category}_ratio" in data:
            return data[f"memory_{category}_ratio"]
        formula = data[f"memory_{category}_formula"]
        return data[f"memory_{category}"] / formula.where(formula > 0)

    memory = pd.DataFrame({"strategy": labels, **{
        category: mb(data[f"memory_{category}"]) + " / " + mb(data[f"memory_{category}_formula"]) + " = " +
        memory_ratio(category).map(lambda v: "n/a" if np.isnan(v) else f"{v:.3f}")
        for category in MEMORY_CATEGORIES}})
    text = ["## Training step (strata-step)", "",
            "Step time: median over timed steps of the per-step max over ranks. MFU: model FLOPs 6N + 6Lhs per token "
            "over the peak of every rank (listed below the table: a CPU run's measured FP32 peak, a GPU run's dense "
            "16-bit tensor-core peak). Phases: median over steps, mean over ranks; exposed "
            "communication is time the step waited for collectives; recompute is the part of backward that "
            "recomputes activations (HFU counts its FLOPs, MFU does not). Memory: high-water mark per rank (max over ranks) "
            "beside the formula; bytes sent per rank per step (mean over ranks) beside the ring formula "
            "(n/a: the library algorithm counts none).", "", markdown_table(table), "",
            *[f"- peak per rank: {peak / 1e9:.1f} GFLOP/s" for peak in sorted(set(data["peak_per_rank"])) if peak > 0],
            "",
            "Memory per rank by category: measured high-water MB / formula MB = their ratio (each the max over "
            "ranks; comm_buffers against the pool's bound, so at most 1; n/a where the formula is 0).", "",
            markdown_table(memory), ""]
    plots = []
    x = np.arange(len(data))

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    bottom = np.zeros(len(data))
    for name, colour, hatch, values in STEP_BARS:
        values = values(column).to_numpy(dtype=float) * 1e3
        if not values.any() and name not in ("forward", "backward", "optimizer", "idle"):
            continue  # a part no case has (no pipeline, no recomputation, ...): left out of the legend
        ax.bar(x, values, bottom=bottom, label=name, color=colour, hatch=hatch, edgecolor="white" if hatch else None)
        bottom += values
    ax.plot(x, step.to_numpy() * 1e3, "k_", markersize=20, label="step (max over ranks)")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("ms per step (median over steps, mean over ranks)")
    ax.set_title("Step time by phase (critical path: recompute on demand and after the gradient; hidden: in a wait)",
                 fontsize=9)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    plots.append(_save(fig, out_dir, "step_phases.png"))

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    width = 0.4
    bottom_measured, bottom_formula = np.zeros(len(data)), np.zeros(len(data))
    for i, category in enumerate(MEMORY_CATEGORIES):
        measured = data[f"memory_{category}"].to_numpy() / 2**20
        formula = data[f"memory_{category}_formula"].to_numpy() / 2**20
        colour = f"C{i}"
        ax.bar(x - width / 2, measured, width, bottom=bottom_measured, color=colour, label=category)
        ax.bar(x + width / 2, formula, width, bottom=bottom_formula, color=colour, hatch="//", alpha=0.5)
        bottom_measured += measured
        bottom_formula += formula
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    for xi, (measured, formula) in enumerate(zip(bottom_measured, bottom_formula)):
        if formula > 0:
            ax.text(xi, max(measured, formula), f"{measured / formula:.3f}", ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("MiB per rank (left: measured high-water, right hatched: formula)")
    ax.set_title("Memory per rank by category (above each pair: measured / formula, all categories)")
    ax.legend(fontsize=7)
    plots.append(_save(fig, out_dir, "step_memory.png"))

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    for offset, tier, colour in ((-0.3, "intra", "tab:purple"), (0.1, "inter", "tab:red")):
        ax.bar(x + offset, data[f"sent_{tier}"].fillna(0) / 1e6, 0.2, color=colour, label=f"{tier} measured")
        ax.bar(x + offset + 0.2, data[f"sent_{tier}_formula"] / 1e6, 0.2, color=colour, hatch="//", alpha=0.5,
               label=f"{tier} ring formula")
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("MB sent per rank per step (mean over ranks)")
    ax.set_title("Bytes per tier")
    ax.legend(fontsize=7)
    plots.append(_save(fig, out_dir, "step_bytes.png"))

    last = data.iloc[-1]
    timeline = step_timeline_plot(last["file"], last["run_id"], int(last["case"]), labels[-1], out_dir)
    if timeline:
        plots.append(timeline)
    if (pp > 1).any():
        pipeline_text, pipeline_plots = pipeline_part(data, labels, column, out_dir)
        text.append(pipeline_text)
        plots += pipeline_plots
    return "\n".join(text), plots


PREDICTED_PHASES = ["forward", "backward", "recompute_window", "optimizer", "comm_exposed", "idle"]
COMPONENTS = ["forward", "backward", "optimizer", "comm_exposed", "idle", "recompute", "comm_tp", "pipeline_wait",
              "recompute_window"]


def _ms(values) -> pd.Series:
    return (pd.Series(values) * 1e3).map(lambda v: "n/a" if np.isnan(v) else f"{v:.3f}")


def project_section(paths: list[str], out_dir: str) -> tuple[str, list[str]]:
    """strata-project runs: each prediction's step, interval and breakdown; each validation's measured against
    predicted step and components, with the errors."""
    predictions = sr.read_table(paths, "prediction", "strata-project")
    validation = sr.read_table(paths, "validation", "strata-project")
    if predictions.empty and validation.empty:
        return "", []
    text = ["## Predictions (strata-project)", "",
            "Step: simulated on a system description (the last op's end over ranks); interval: the description's figures "
            "at the ends of their relative spreads. Phases: mean over ranks, strata-step's conventions (backward includes "
            "the recomputation on demand; comm_exposed includes comm_tp and pipeline_wait, the bubble). MFU: 6N + 6Lhs "
            "model FLOPs per token over the description's peak of the dtype.", ""]
    plots = []
    if not predictions.empty:
        p = predictions.reset_index(drop=True)
        labels = [f"{r.label} {r.model} {r.tp}x{r.pp}x{r.dp}" for r in p.itertuples()]
        table = pd.DataFrame({
            "prediction": labels, "dtype": p["dtype"],
            "step (ms)": _ms(p["step_time"]) + " [" + _ms(p["step_time_low"]) + ", " + _ms(p["step_time_high"]) + "]",
            "tokens/s": p["tokens_per_s"].map("{:.0f}".format), "MFU %": (100 * p["mfu"]).map("{:.2f}".format),
            **{f"{c} (ms)": _ms(p[f"phase_{c}"]) for c in PREDICTED_PHASES},
            "memory/rank (GiB)": (sum(p[f"memory_{c}"] for c in MEMORY_CATEGORIES) / 2**30).map("{:.3f}".format),
        })
        systems = ", ".join(dict.fromkeys(p["system"]))
        text += [f"System description(s): {systems}.", "", markdown_table(table), ""]
        fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
        x = np.arange(len(p))
        bottom = np.zeros(len(p))
        for phase in PREDICTED_PHASES:
            values = p[f"phase_{phase}"].to_numpy() * 1e3
            ax.bar(x, values, bottom=bottom, label=phase)
            bottom += values
        ax.errorbar(x, p["step_time"] * 1e3, yerr=[(p["step_time"] - p["step_time_low"]) * 1e3,
                                                   (p["step_time_high"] - p["step_time"]) * 1e3],
                    fmt="k_", capsize=4, label="step and interval")
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("ms per step (simulated, mean over ranks)")
        ax.set_title("Predicted step by phase")
        ax.legend(fontsize=7)
        plots.append(_save(fig, out_dir, "prediction_phases.png"))
    if not validation.empty:
        v = validation.reset_index(drop=True)
        errors = v["step_time_error"].abs()
        text += ["### Validation: predicted against measured strata-step cases", "",
                 f"{len(v)} case(s): step-time error mean absolute {100 * errors.mean():.1f} %, worst "
                 f"{100 * errors.max():.1f} % ({v.loc[errors.idxmax(), 'label']}); measured in the interval "
                 f"{int(v['within_interval'].sum())} of {len(v)}. Measured step: median of the per-step max over ranks; "
                 "phase errors: (predicted - measured) / the measured step, in %.", ""]
        table = pd.DataFrame({
            "case": v["label"] + " " + v["tp"].astype(str) + "x" + v["pp"].astype(str) + "x" + v["dp"].astype(str),
            "measured (ms)": _ms(v["step_time_measured"]),
            "predicted (ms)": _ms(v["step_time_predicted"]) + " [" + _ms(v["step_time_low"]) + ", " +
            _ms(v["step_time_high"]) + "]",
            "error %": (100 * v["step_time_error"]).map("{:+.1f}".format),
            **{c: (100 * v[f"phase_{c}_error"]).map("{:+.1f}".format) for c in COMPONENTS},
        })
        text += [markdown_table(table), ""]
        fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
        x = np.arange(len(v))
        width = 0.4
        bottom_m, bottom_p = np.zeros(len(v)), np.zeros(len(v))
        for i, phase in enumerate(PREDICTED_PHASES):
            measured = v[f"phase_{phase}_measured"].to_numpy() * 1e3
            predicted = v[f"phase_{phase}_predicted"].to_numpy() * 1e3
            ax.bar(x - width / 2, measured, width, bottom=bottom_m, color=f"C{i}", label=phase)
            ax.bar(x + width / 2, predicted, width, bottom=bottom_p, color=f"C{i}", hatch="//", alpha=0.5)
            bottom_m += measured
            bottom_p += predicted
        ax.plot(x - width / 2, v["step_time_measured"] * 1e3, "k_", markersize=14, label="step (max over ranks)")
        ax.plot(x + width / 2, v["step_time_predicted"] * 1e3, "k_", markersize=14)
        ax.set_xticks(x)
        ax.set_xticklabels(table["case"], rotation=45, ha="right", fontsize=7)
        ax.set_ylabel("ms per step (left: measured, right hatched: predicted; mean over ranks)")
        ax.set_title("Measured against predicted, per component")
        ax.legend(fontsize=7)
        plots.append(_save(fig, out_dir, "validation_phases.png"))
    return "\n".join(text), plots


def rank_spread_plot(paths: list[str], out_dir: str) -> tuple[str, list[str]]:
    """Per-rank medians relative to the median rank, per case: which ranks (hosts) are slow."""
    samples = sr.read_table(paths, "samples")
    ranks = sr.read_table(paths, "ranks")
    cases = sr.read_table(paths, "cases")
    if samples.empty or cases.empty:  # samples without their cases (a damaged run) have nothing to be named by
        return "", []
    medians = samples.groupby(["file", "run_id", "case", "rank"], as_index=False)["time"].median()
    medians["relative"] = medians["time"] / medians.groupby(["file", "run_id", "case"])["time"].transform("median")
    medians = medians.merge(ranks[["file", "run_id", "rank", "host"]], on=["file", "run_id", "rank"], how="left")
    medians = medians.merge(cases[["file", "run_id", "case", "label", "benchmark"]], on=["file", "run_id", "case"])
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    keys = list(dict.fromkeys(zip(medians["run_id"], medians["case"])))
    for rank, group in medians.groupby("rank"):
        xs = [keys.index((r, c)) for r, c in zip(group["run_id"], group["case"])]
        ax.plot(xs, group["relative"], "o", label=f"rank {rank} ({group['host'].iloc[0]})", alpha=0.8)
    ax.axhline(1.0, color="black", linewidth=1)
    names = medians.drop_duplicates(["run_id", "case"])
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{b.replace('strata-', '')} {l}" for b, l in zip(names["benchmark"], names["label"])],
                       rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("rank's median time / median over ranks (1)")
    ax.set_title("Per-rank spread: each rank's own median time, relative to the middle rank")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = os.path.join(out_dir, "rank_spread.png")
    fig.savefig(path)
    plt.close(fig)
    worst = medians.sort_values("relative", ascending=False).head(3)
    lines = ["## Per-rank spread", "", "Slowest rank medians relative to the median rank of their case:", ""]
    lines += [f"- {row.benchmark} {row.label}: rank {row.rank} on {row.host}: {row.relative:.3f}x"
              for row in worst.itertuples(index=False)]
    return "\n".join(lines) + "\n", [path]


def generic_section(benchmark: str, data: pd.DataFrame, out_dir: str) -> tuple[str, list[str]]:
    """Any program without a section of its own: each case's label, time and, where stored, FLOP rate."""
    table = pd.DataFrame({
        "run": data["run_id"].str.slice(0, 15),
        "case": data["label"],
        "ranks": data["n_ranks"],
        "time median (ms)": (data["time_rankmax_median"] * 1e3).map("{:.3f}".format),
    })
    if "flop_rate_per_rank" in data:
        table["GFLOP/s per rank"] = (data["flop_rate_per_rank"] / 1e9).map("{:.1f}".format)
    text = [f"## {benchmark}", "", "Time: median over iterations of the per-iteration max over ranks.", "",
            markdown_table(table), ""]
    return "\n".join(text), []


def search_section(paths: list[str]) -> str:
    """strata-project search: each run's top configurations by predicted step time, and PaRO's rule beside the
    search where a run compared them."""
    text = []
    search = sr.read_table(paths, "search")
    for (path, run_id), data in (search.groupby(["file", "run_id"], sort=False) if not search.empty else []):
        first = data.iloc[0]
        gb = lambda column: (data[column] / 1e9).map("{:.1f}".format)
        table = pd.DataFrame({
            "rank": data["rank"], "configuration": data["label"],
            "step (s)": data["step"].map("{:.4f}".format), "compute (s)": data["compute"].map("{:.4f}".format),
            "exposed tp / pp / dp (s)": [f"{r.exposed_tp:.3f} / {r.exposed_pp + r.exposed_other:.3f} / "
                                         f"{r.exposed_dp + r.exposed_dp_intra + r.exposed_dp_inter:.3f}"
                                         for r in data.itertuples()],
            "idle (s)": data["idle"].map("{:.4f}".format), "memory (GB)": gb("memory_total"),
            "MFU %": (100 * data["mfu"]).map("{:.2f}".format), "tokens/s": data["tokens_per_s"].map("{:.0f}".format),
        })
        text += [f"## Search: {first['model']} on {int(first['devices'])} devices ({run_id[-6:]})", "",
                 f"{first['system']}; global batch {int(first['global_batch'])} x {int(first['seq'])} tokens, "
                 f"{first['dtype']}, memory limit {first['memory_limit'] / 1e9:.1f} GB per device. Predicted by the "
                 "simulator from the step executor's trace; compute, exposed communication and idle are means over "
                 "ranks that add up to the step; memory is the pipeline rank that needs the most.", "",
                 markdown_table(table), ""]
    paro = sr.read_table(paths, "paro_rule")
    if not paro.empty:
        both = paro[(paro["rule_choice"] != "") & (paro["search_choice"] != "")]
        same = int(both["agree"].sum())
        ties = int(((both["same_step"] == 1) & (both["agree"] == 0)).sum())
        regret = (both["rule_step"] / both["search_step"] - 1).max() if len(both) else 0.0
        table = pd.DataFrame({
            "model": paro["model"], "trains": paro["trainable"], "nodes": paro["nodes"], "m": paro["micro_batches"],
            "B'/B": paro["bandwidth_ratio"].map("{:.1f}".format), "rule": paro["rule_choice"],
            "search": paro["search_choice"],
            "rule / best step": (paro["rule_step"] / paro["search_step"].where(paro["search_step"] > 0)).map("{:.4f}".format),
        })
        text += ["## PaRO's rule beside the search", "",
                 f"The same strategy in {same} of {len(both)} scenarios where both choose, a strategy of the same "
                 f"simulated step in {ties} more; the rule's choice at most {100 * regret:.1f}% slower than the "
                 "search's best (both simulated).", "", markdown_table(table), ""]
    return "\n".join(text)


# The report's sections by the name bench/programs.txt gives a program's section ("-": none). A case section draws
# the program's cases; strata-project's runs have none (predictions and validations of their own), so its section
# reads the files itself.
SECTIONS = {"gemm": gemm_section, "collective": collective_section, "attention": attention_section,
            "step": step_section}
FILE_SECTIONS = {"project": project_section}
SECTION_NAMES = (*SECTIONS, *FILE_SECTIONS)


def registered_sections() -> dict[str, str]:
    """Program name -> report section, from bench/programs.txt (name | sources | report | suite runs): the checkout's
    or the install's (share/strata/bench). The pip package has no registry: there a program's section is its name
    without "strata-", as every registered one is."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench",
                        "programs.txt")
    sections = {}
    if not os.path.isfile(path):
        return {f"strata-{name}": name for name in SECTION_NAMES}
    with open(path) as registry:
        for line in registry:
            if line.strip() and not line.lstrip().startswith("#"):
                fields = [f.strip() for f in line.split("|")]
                sections[fields[0]] = fields[2]
    return sections


def check_out_dir(out_dir: str, inputs: list[str], flag: str) -> None:
    """Before anything is written: the folder is a folder that takes new files (or can be made in one), and none of
    the files the report writes in it (report.md, *.png) is an input or an HDF5 file."""
    if not os.path.exists(out_dir):
        sr.check_folder_writable(flag, os.path.dirname(os.path.abspath(out_dir)))
        return
    if not os.path.isdir(out_dir):
        raise sr.StrataFileError(f"{out_dir}: {flag} is not a folder")
    written = [os.path.join(out_dir, "report.md")]
    written += [os.path.join(out_dir, name) for name in sorted(os.listdir(out_dir)) if name.endswith(".png")]
    sr.check_outputs([("FILE", path) for path in inputs], replaced=[(flag, path, "the report") for path in written])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="strata-report", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="Strata results files (.h5)")
    parser.add_argument("--out", help="folder for report.md and the PNG plots")
    parser.add_argument("--quiet", action="store_true", help="do not print the markdown")
    args = parser.parse_args(argv)
    if args.out == "":
        parser.error("--out: an empty folder name")
    out_dir = args.out or os.path.splitext(args.files[0])[0] + "-report"
    check_out_dir(out_dir, args.files, "--out" if args.out else "the default --out")
    try:
        runs = sr.read_runs(args.files)
    except sr.StrataFileError as error:
        print(f"strata-report: error: {error}", file=sys.stderr)
        return 2
    if runs.empty:
        print("strata-report: error: the files hold no runs", file=sys.stderr)
        return 2
    os.makedirs(out_dir, exist_ok=True)

    sections = [f"# Strata report", "", f"{len(runs)} run(s) from {len(set(runs['file']))} file(s).", ""]
    status = runs[["run_id", "benchmark", "status", "n_ranks", "n_nodes", "launcher", "start_utc"]]
    sections += ["## Runs", "", markdown_table(status), ""]
    plots: list[str] = []
    # Every program in the files, in registry order, then any the registry does not know.
    registry = registered_sections()
    present = list(dict.fromkeys(runs["benchmark"]))
    for benchmark in [b for b in registry if b in present] + [b for b in present if b not in registry]:
        file_section = FILE_SECTIONS.get(registry.get(benchmark, "-"))
        if file_section:
            text, files = file_section(args.files, out_dir)
            sections.append(text)
            plots += files
            continue
        data = sr.read_cases_with_summary(args.files, benchmark)
        if data.empty:
            continue
        section = SECTIONS.get(registry.get(benchmark, "-"))
        text, files = section(data, out_dir) if section else generic_section(benchmark, data, out_dir)
        sections.append(text)
        plots += files
    text = search_section(args.files)
    if text:
        sections.append(text)
    text, files = rank_spread_plot(args.files, out_dir)
    sections.append(text)
    plots += files
    sections += ["## Plots", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in plots]
    report = "\n".join(sections) + "\n"
    with open(os.path.join(out_dir, "report.md"), "w") as handle:
        handle.write(report)
    if not args.quiet:
        print(report)
    print(f"strata-report: wrote {os.path.join(out_dir, 'report.md')} and {len(plots)} plot(s)", file=sys.stderr)
    return 0


def console_main() -> int:
    """The `strata-report` command (the package's entry point and scripts/strata-report)."""
    return sr.run_script("strata-report", main, sys.argv[1:])


if __name__ == "__main__":
    sys.exit(console_main())
