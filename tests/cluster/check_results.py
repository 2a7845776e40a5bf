#!/usr/bin/env python3
"""Checks on the results files the cluster tests' jobs wrote, called from the shell scripts beside it.

  check_results.py runs FILE [--benchmarks a,b] [--job-id ID] [--n-nodes N] [--n-ranks R] [--launcher L]
                             [--hosts h1,h2] [--nodelist TEXT] [--runs K] [--layouts 1x1,2x1,...]
                             [--multi-node-hosts h1,h2]
  check_results.py volume FILE --tx BYTES --rx BYTES      veth counters grew by at least the bytes the
                                                          two-node allreduce cases must have moved
  check_results.py step-volume FILE --tx BYTES --rx BYTES the link carried what strata-step's ring collectives
                                                          counted across nodes (and not far more)
  check_results.py horing-volume JSON --tx BYTES --rx BYTES --hosts h1,h2
                                                          the link carried what strata-bench-horing's HO-Ring
                                                          counted across nodes, which equals the formula
  check_results.py horing-overlap JSON --judge OPS --hosts h1,h2
                                                          HO-Ring faster than the sum of its phases run alone
                                                          (for the operations in OPS; the others reported)
  check_results.py merged OUT IN...                       every run of every IN is in OUT, unchanged

Prints one line saying what was found; exit status 0 when every check holds, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))

import h5py  # noqa: E402
import numpy as np  # noqa: E402

import strata_results as sr  # noqa: E402


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_runs(args) -> list[str]:
    problems = []
    runs = sr.read_runs(args.file)
    if runs.empty:
        return [f"{args.file} holds no runs"]
    if args.runs is not None and len(runs) != args.runs:
        problems.append(f"{len(runs)} run(s), expected {args.runs}")
    if args.benchmarks is not None:
        want = sorted(filter(None, args.benchmarks.split(",")))
        got = sorted(set(runs["benchmark"]))
        if got != want:
            problems.append(f"benchmarks {got}, expected {want}")
    with h5py.File(args.file, "r") as f:
        for row in runs.to_dict("records"):
            where = f"run {row['run_id']} ({row['benchmark']})"
            expect = {"status": "ok", "launcher": args.launcher, "slurm_job_id": args.job_id,
                      "n_nodes": args.n_nodes, "n_ranks": args.n_ranks, "slurm_nodelist": args.nodelist}
            for key, value in expect.items():
                if value is not None and str(row.get(key, "")) != str(value):
                    problems.append(f"{where}: {key} = {row.get(key)!r}, expected {value!r}")
            group = f["runs"][row["run_id"]]
            hosts = json.loads(row.get("hosts", "[]") or "[]")
            rank_hosts = sorted(set(text(h) for h in group["ranks/host"][()]))
            if args.hosts is not None:
                want = sorted(args.hosts.split(","))
                if sorted(hosts) != want:
                    problems.append(f"{where}: hosts attribute {hosts}, expected {want}")
                if rank_hosts != want:
                    problems.append(f"{where}: ranks table hosts {rank_hosts}, expected {want}")
            if args.multi_node_hosts is not None:
                known = sorted(args.multi_node_hosts.split(","))
                want = known if int(row["n_nodes"]) > 1 else None
                if want is not None and (sorted(hosts) != want or rank_hosts != want):
                    problems.append(f"{where}: a {row['n_nodes']}-node run names hosts {hosts} (ranks: {rank_hosts}), "
                                    f"expected {want}")
                if want is None and (len(hosts) != 1 or hosts[0] not in known):
                    problems.append(f"{where}: a one-node run names hosts {hosts}, expected one of {known}")
            nodes = sorted(set(group["ranks/node_index"][()].tolist()))
            if str(len(nodes)) != str(row.get("n_nodes")):
                problems.append(f"{where}: ranks table spans {len(nodes)} node(s), n_nodes says {row.get('n_nodes')}")
            if len(group["ranks/rank"]) != int(row.get("n_ranks", -1)):
                problems.append(f"{where}: ranks table has {len(group['ranks/rank'])} rows for n_ranks "
                                f"{row.get('n_ranks')}")
            if group["samples/time"].shape[0] == 0 or group["cases/case"].shape[0] == 0:
                problems.append(f"{where}: no cases or samples")
            elif not np.all(group["samples/time"][()] > 0):
                problems.append(f"{where}: a sample time is not positive")
    if args.layouts is not None:
        want = sorted(args.layouts.split(","))
        got = sorted(f"{r['n_nodes']}x{int(r['n_ranks']) // int(r['n_nodes'])}" for r in runs.to_dict("records"))
        if got != want:
            problems.append(f"layouts (nodes x ranks per node) {got}, expected {want}")
    found = ", ".join(f"{r['benchmark']} {r['n_ranks']}r/{r['n_nodes']}n {r['launcher']} job {r['slurm_job_id'] or '-'} "
                      f"hosts {r['hosts']}" for r in runs.to_dict("records"))
    print(f"{os.path.basename(args.file)}: {len(runs)} run(s): {found}")
    return problems


def two_node_allreduce_bytes(path: str) -> tuple[float, int]:
    """Bytes that must cross between two nodes in each direction: in an allreduce of S bytes every rank
    ends with a sum that depends on the other node's S bytes, so at least S bytes cross the cut each way,
    per operation. Counted over the timed operations only (warm-up and check iterations add more)."""
    cases = sr.read_table(path, "cases", "strata-collective")
    samples = sr.read_table(path, "samples", "strata-collective")
    if cases.empty:
        return 0.0, 0
    nodes_col = "n_nodes" if "n_nodes" in cases.columns else "run_n_nodes"
    chosen = cases[(cases["operation"] == "allreduce") & (cases[nodes_col].astype(int) == 2)]
    rank0 = samples[samples["rank"] == 0].groupby(["run_id", "case"]).size().rename("timed").reset_index()
    chosen = chosen.merge(rank0, on=["run_id", "case"], how="inner")
    total = float((chosen["timed"] * chosen["ops_per_sample"] * chosen["size_bytes"]).sum())
    return total, len(chosen)


def check_volume(args) -> list[str]:
    need, n = two_node_allreduce_bytes(args.file)
    print(f"{os.path.basename(args.file)}: {n} two-node allreduce case(s) must move >= {need / 1e6:.1f} MB each way; "
          f"veth counters grew by tx {args.tx / 1e6:.1f} MB, rx {args.rx / 1e6:.1f} MB")
    if n == 0 or need <= 0:
        return ["no two-node allreduce case in the file"]
    problems = []
    if args.tx < need:
        problems.append(f"tx grew by {args.tx} B < {need:.0f} B")
    if args.rx < need:
        problems.append(f"rx grew by {args.rx} B < {need:.0f} B")
    return problems


def check_step_volume(args) -> list[str]:
    """strata-step on Strata's ring counts the bytes each rank sends across nodes per step (the `sent_inter`
    metric, equal to the formula); every step sends the same, so the job moved that times the steps it ran
    (warm-up included) over the link. Other traffic (start-up, the results gathered to rank 0, headers) may
    add to it, within a bound."""
    problems, total = [], 0.0
    for run_id in sr.run_ids(args.file):
        steps_untimed = int(sr.config(args.file, run_id).get("warmup", 0))
        summary = sr.read_run_table(args.file, run_id, "summary")
        cases = sr.read_run_table(args.file, run_id, "cases")
        for row in cases.merge(summary, on="case").itertuples():
            if abs(row.sent_inter - row.sent_inter_formula) > 1e-9 * max(1.0, row.sent_inter_formula):
                problems.append(f"{row.strategy}: sent_inter {row.sent_inter:.0f} B per rank, formula {row.sent_inter_formula:.0f}")
        metrics = sr.read_run_table(args.file, run_id, "metrics", where={"metric": "sent_inter"})
        for (case, rank), group in metrics.groupby(["case", "rank"]):
            total += float(group["value"].sum()) + steps_untimed * float(group["value"].iloc[0])
    moved = args.tx + args.rx
    print(f"{os.path.basename(args.file)}: the steps' ring collectives sent {total / 1e6:.2f} MB across nodes; "
          f"veth counters grew by tx {args.tx / 1e6:.2f} MB + rx {args.rx / 1e6:.2f} MB")
    if total <= 0:
        problems.append("no bytes across nodes recorded")
    if moved < total:
        problems.append(f"the link carried {moved} B < {total:.0f} B")
    if moved > 1.5 * total + 16e6:
        problems.append(f"the link carried {moved} B, far above the steps' {total:.0f} B")
    return problems


def read_horing(path: str, hosts: str) -> tuple[dict, list[str]]:
    """strata-bench-horing's --json figures, and whether they come from real nodes on the expected hosts."""
    with open(path) as handle:
        figures = json.load(handle)
    problems = []
    if figures.get("emulated") or figures.get("nodes") != 2:
        problems.append(f"nodes {figures.get('nodes')}, emulated {figures.get('emulated')}: expected 2 real nodes")
    if sorted(figures.get("hosts", [])) != sorted(hosts.split(",")):
        problems.append(f"hosts {figures.get('hosts')}, expected {hosts}")
    for row in figures.get("rows", []):
        for name, traffic in row["traffic"].items():
            if not traffic["match"]:
                problems.append(f"{row['operation']} {row['bytes']} B {name}: bytes per tier {traffic['intra_per_rank']:.0f} / "
                                f"{traffic['inter_per_rank']:.0f} per rank, formula {traffic['intra_formula_per_rank']:.0f} / "
                                f"{traffic['inter_formula_per_rank']:.0f}")
    return figures, problems


def check_horing_volume(args) -> list[str]:
    """HO-Ring's counted bytes across nodes (every call of the job: warm-up, timed, checks; summed over ranks)
    equal its formula, and the veth pair carried them: at least that, and little more (MPI's start-up, the
    barriers and the maxima of the timing, TCP's headers and acknowledgements)."""
    figures, problems = read_horing(args.file, args.hosts)
    sent = figures.get("sent", {}).get("horing")
    if not sent:
        return problems + ["no HO-Ring operation in the figures"]
    counted, formula = sent["inter_bytes"], sent["inter_formula"]
    moved = args.tx + args.rx
    ops = sorted({f"{row['operation']} {row['bytes'] >> 20} MiB" for row in figures["rows"]})
    print(f"HO-Ring ({', '.join(ops)}; 2 nodes x {figures['ranks_per_node']} ranks) sent {counted / 1e6:.2f} MB across "
          f"nodes, formula {formula / 1e6:.2f} MB; veth carried tx {args.tx / 1e6:.2f} + rx {args.rx / 1e6:.2f} = "
          f"{moved / 1e6:.2f} MB ({moved / max(formula, 1):.4f}x the formula)")
    if counted != formula:
        problems.append(f"HO-Ring counted {counted} B across nodes, the formula {formula} B")
    if moved < formula:
        problems.append(f"the link carried {moved} B < the formula's {formula} B")
    if moved > 1.05 * formula + 4e6:
        problems.append(f"the link carried {moved} B, more than 1.05x the formula's {formula} B + 4 MB")
    return problems


def check_horing_overlap(args) -> list[str]:
    """Both tiers busy at once: HO-Ring's time per operation below the sum of the two-level algorithm's phases,
    each timed alone on the same groups (medians of the max over ranks)."""
    figures, problems = read_horing(args.file, args.hosts)
    judged = set(args.judge.split(","))
    parts = []
    for row in figures.get("rows", []):
        times = row["median_s"]
        if "horing" not in times or row["phases_sum_s"] <= 0:
            continue
        phases = row["phases"]
        ratio = times["horing"] / row["phases_sum_s"]
        is_judged = row["operation"] in judged
        parts.append(f"{row['operation']} {row['bytes'] >> 20} MiB ({row['chunks']} chunks): HO-Ring "
                     f"{times['horing'] * 1e3:.1f} ms, hierarchical {times.get('hierarchical', float('nan')) * 1e3:.1f} ms, "
                     f"phases alone {' + '.join(f'{times[p] * 1e3:.1f}' for p in phases)} = {row['phases_sum_s'] * 1e3:.1f} ms, "
                     f"HO-Ring/sum {ratio:.3f}{' (judged)' if is_judged else ''}")
        if is_judged and ratio >= 1:
            problems.append(f"{row['operation']} {row['bytes']} B: HO-Ring {times['horing'] * 1e3:.1f} ms is not below the "
                            f"sum of its phases {row['phases_sum_s'] * 1e3:.1f} ms")
    if not any(part.endswith("(judged)") for part in parts):
        problems.append(f"no HO-Ring and phase times for {args.judge} in the figures")
    print("; ".join(parts))
    return problems


def check_merged(args) -> list[str]:
    problems, count = [], 0
    with h5py.File(args.out, "r") as out:
        for path in args.inputs:
            with h5py.File(path, "r") as source:
                for run_id, group in source["runs"].items():
                    count += 1
                    if run_id not in out["runs"]:
                        problems.append(f"run {run_id} of {path} is missing from {args.out}")
                    elif not sr.groups_equal(group, out["runs"][run_id]):
                        problems.append(f"run {run_id} of {path} differs in {args.out}")
        print(f"{os.path.basename(args.out)}: {len(out['runs'])} run(s); {count} input run(s) checked")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    runs = sub.add_parser("runs")
    runs.add_argument("file")
    for name in ("benchmarks", "job_id", "n_nodes", "n_ranks", "launcher", "hosts", "nodelist", "layouts",
                 "multi_node_hosts"):
        runs.add_argument("--" + name.replace("_", "-"))
    runs.add_argument("--runs", type=int)
    volume = sub.add_parser("volume")
    volume.add_argument("file")
    volume.add_argument("--tx", type=int, required=True)
    volume.add_argument("--rx", type=int, required=True)
    step_volume = sub.add_parser("step-volume")
    step_volume.add_argument("file")
    step_volume.add_argument("--tx", type=int, required=True)
    step_volume.add_argument("--rx", type=int, required=True)
    horing_volume = sub.add_parser("horing-volume")
    horing_volume.add_argument("file")
    horing_volume.add_argument("--tx", type=int, required=True)
    horing_volume.add_argument("--rx", type=int, required=True)
    horing_volume.add_argument("--hosts", required=True)
    horing_overlap = sub.add_parser("horing-overlap")
    horing_overlap.add_argument("file")
    horing_overlap.add_argument("--judge", required=True)
    horing_overlap.add_argument("--hosts", required=True)
    merged = sub.add_parser("merged")
    merged.add_argument("out")
    merged.add_argument("inputs", nargs="+")
    args = parser.parse_args()
    try:
        problems = {"runs": check_runs, "volume": check_volume, "step-volume": check_step_volume,
                    "horing-volume": check_horing_volume, "horing-overlap": check_horing_overlap,
                    "merged": check_merged}[args.command](args)
    except (OSError, KeyError, ValueError, sr.StrataFileError) as error:
        problems = [f"cannot read the results: {error}"]
    for problem in problems:
        print(f"problem: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
