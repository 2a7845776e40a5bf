"""Every column the programs derive, recomputed here from the raw `samples` table of the same file: each rank
statistic of time for both rank views, the per-rank medians, the FLOP rates and the fraction of peak, algbw,
busbw and busbw_rankmean, the per-group table, the same rates and the slowdown of strata-collective's concurrent
(--mixed) path; and every table's `rows` attribute after several appends (cases appended one by one, and two runs
in one file)."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from conftest import mpirun, program

ITERS = 5
PROGRAMS = {
    "strata-gemm": (2, ["--shapes", "24x16x40,7x9x5", "-d", "fp32,fp64"]),
    "strata-attention": (2, ["-s", "16,24", "-H", "2", "-D", "8", "--causal", "no", "-p", "fwd,fwdbwd",
                             "--impl", "flash"]),
    "strata-collective": (4, ["--collective", "allreduce,allgather,reduce_scatter,broadcast", "-a", "library,ring",
                              "-b", "96", "-e", "384", "-f", "4", "--ranks-per-node", "2", "--group", "intra"]),
}
BUS = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
       "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n,
       "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "sendrecv": lambda n: 1.0}


def table(run, name):
    group = run[name]
    return {key: group[key][()] for key in group.keys()}, int(group.attrs["rows"])


def stats(values):
    values = np.asarray(values, dtype=float)
    return {"min": values.min(), "p05": np.percentile(values, 5), "median": np.median(values),
            "mean": values.mean(), "p95": np.percentile(values, 95), "p99": np.percentile(values, 99),
            "max": values.max(), "stddev": values.std(ddof=1) if len(values) > 1 else 0.0}


@pytest.fixture(scope="module", params=sorted(PROGRAMS))
def two_runs(request, tmp_path_factory):
    name = request.param
    ranks, args = PROGRAMS[name]
    work = tmp_path_factory.mktemp(name)
    out = work / "two-runs.h5"
    for _ in range(2):
        result = mpirun(ranks, [program(name), *args, "-n", str(ITERS), "-w", "1", "-q", "--output", str(out)],
                        cwd=str(work), timeout=180)
        assert result.returncode == 0, result.stderr[-3000:]
    return name, ranks, out


def runs_of(path):
    with h5py.File(path) as f:
        return [(run_id, {t: table(f["runs"][run_id], t) for t in f["runs"][run_id].keys() if t != "env"})
                for run_id in sorted(f["runs"].keys())]


def per_iteration(samples, case, ranks):
    mask = samples["case"] == case
    time = samples["time"][mask].reshape(-1)
    rank, iteration = samples["rank"][mask], samples["iteration"][mask]
    iters = int(iteration.max()) + 1
    grid = np.full((ranks, iters), np.nan)
    grid[rank, iteration] = time
    assert not np.isnan(grid).any(), "every rank has every iteration"
    return grid


def test_rows_attribute_counts_every_append(two_runs):
    name, ranks, out = two_runs
    runs = runs_of(out)
    assert len(runs) == 2
    for _, tables in runs:
        n_cases = tables["cases"][1]
        assert n_cases > 1
        for t, (columns, rows) in tables.items():
            assert all(len(values) == rows for values in columns.values()), t
        assert tables["summary"][1] == n_cases
        assert tables["samples"][1] == n_cases * ranks * ITERS
        assert tables["ranks"][1] == ranks
        assert list(tables["cases"][0]["case"]) == list(range(n_cases))


def test_time_statistics_from_samples(two_runs):
    name, ranks, out = two_runs
    for _, tables in runs_of(out):
        samples, summary = tables["samples"][0], tables["summary"][0]
        for row, case in enumerate(summary["case"]):
            grid = per_iteration(samples, case, ranks)
            assert summary["iterations"][row] == grid.shape[1] == ITERS
            for view, series in (("rankmax", grid.max(axis=0)), ("rankmean", grid.mean(axis=0))):
                for stat, value in stats(series).items():
                    assert summary[f"time_{view}_{stat}"][row] == pytest.approx(value, rel=1e-12, abs=1e-15), \
                        (case, view, stat)
            medians = np.median(grid, axis=1)
            assert summary["time_slowest_rank_median"][row] == pytest.approx(medians.max(), rel=1e-12)
            assert summary["time_fastest_rank_median"][row] == pytest.approx(medians.min(), rel=1e-12)
            assert summary["slowest_rank"][row] == int(np.argmax(medians))


def test_derived_rates_from_samples(two_runs):
    name, ranks, out = two_runs
    for _, tables in runs_of(out):
        samples, summary, cases = tables["samples"][0], tables["summary"][0], tables["cases"][0]
        for row, case in enumerate(summary["case"]):
            grid = per_iteration(samples, case, ranks)
            rankmax, rankmean = np.median(grid.max(axis=0)), np.median(grid.mean(axis=0))
            if name == "strata-collective":
                size, n = cases["size_bytes"][row], int(cases["group_size"][row])
                op = cases["operation"][row].decode() if isinstance(cases["operation"][row], bytes) else cases["operation"][row]
                assert summary["bus_factor"][row] == pytest.approx(BUS[op](n))
                assert summary["algbw"][row] == pytest.approx(size / rankmax, rel=1e-12)
                assert summary["busbw"][row] == pytest.approx(size / rankmax * BUS[op](n), rel=1e-12)
                assert summary["busbw_rankmean"][row] == pytest.approx(size / rankmean * BUS[op](n), rel=1e-12)
            else:
                flop = cases["flop"][row]
                per_rank = flop / rankmean
                assert summary["flop_rate_per_rank"][row] == pytest.approx(per_rank, rel=1e-12)
                assert summary["flop_rate_aggregate"][row] == pytest.approx(ranks * flop / rankmax, rel=1e-12)
                slowest = np.median(grid, axis=1).max()
                assert summary["flop_rate_slowest_rank"][row] == pytest.approx(flop / slowest, rel=1e-12)
                peak = summary["peak_per_rank"][row]
                expected = per_rank / peak if peak > 0 else 0.0
                assert summary["peak_fraction"][row] == pytest.approx(expected, rel=1e-12)


def test_cases_flop_column(two_runs):
    name, _, out = two_runs
    if name == "strata-collective":
        pytest.skip("collectives count bytes, not FLOPs")
    for _, tables in runs_of(out):
        cases = tables["cases"][0]
        for row in range(tables["cases"][1]):
            if name == "strata-gemm":
                expected = 2.0 * cases["m"][row] * cases["n"][row] * cases["k"][row]
            else:
                fwd = 4.0 * cases["batch"][row] * cases["heads_q"][row] * cases["seq_q"][row] * cases["seq_kv"][row] \
                    * cases["head_dim"][row] / (2 if cases["causal"][row] else 1)
                p = cases["pass"][row].decode() if isinstance(cases["pass"][row], bytes) else cases["pass"][row]
                expected = {"fwd": fwd, "bwd": 2.5 * fwd, "fwdbwd": 3.5 * fwd}[p]
            assert cases["flop"][row] == pytest.approx(expected, rel=1e-15)


def test_group_table_from_samples(two_runs):
    name, ranks, out = two_runs
    if name != "strata-collective":
        pytest.skip("strata-collective writes the groups table")
    for _, tables in runs_of(out):
        samples, groups, cases = tables["samples"][0], tables["groups"][0], tables["cases"][0]
        assert tables["groups"][1] == len(groups["case"]) == 2 * tables["cases"][1]  # two groups of two per case
        for row, case in enumerate(groups["case"]):
            members = [int(r) for r in (groups["world_ranks"][row].decode() if isinstance(groups["world_ranks"][row], bytes)
                                        else groups["world_ranks"][row]).split(",")]
            grid = per_iteration(samples, case, ranks)
            median = np.median(grid[members].max(axis=0))
            assert groups["time_median"][row] == pytest.approx(median, rel=1e-12)
            size = cases["size_bytes"][int(case)]
            assert groups["algbw"][row] == pytest.approx(size / median, rel=1e-12)
            op = cases["operation"][int(case)]
            op = op.decode() if isinstance(op, bytes) else op
            assert groups["busbw"][row] == pytest.approx(size / median * BUS[op](len(members)), rel=1e-12)


MIXED_RANKS = 4
MIXED = ["--grid", "tp=2,dp=2", "--mixed", "-b", "4K", "-e", "16K", "-f", "4"]


def text(value):
    return value.decode() if isinstance(value, bytes) else value


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    """strata-collective --mixed: an allreduce in the TP groups and a reduce-scatter in the DP groups, each alone and
    beside the other, at two sizes."""
    work = tmp_path_factory.mktemp("mixed")
    out = work / "mixed.h5"
    result = mpirun(MIXED_RANKS, [program("strata-collective"), *MIXED, "-n", str(ITERS), "-w", "1", "-q",
                                  "--output", str(out)], cwd=str(work), timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    (_, tables), = runs_of(out)
    return tables


def test_mixed_rates_from_samples(mixed_run):
    samples, summary, cases = mixed_run["samples"][0], mixed_run["summary"][0], mixed_run["cases"][0]
    assert mixed_run["cases"][1] == mixed_run["summary"][1] == 8  # two sizes, four rows each
    alone_median = {}
    for row in np.argsort(summary["case"], kind="stable"):
        case = summary["case"][row]
        at = int(np.flatnonzero(cases["case"] == case)[0])
        op, size, n = text(cases["operation"][at]), cases["size_bytes"][at], int(cases["group_size"][at])
        concurrent = text(cases["concurrent_with"][at]) != ""
        grid = per_iteration(samples, case, MIXED_RANKS)
        rankmax, rankmean = np.median(grid.max(axis=0)), np.median(grid.mean(axis=0))
        assert rankmax != rankmean, "the ranks' times differ, so the two views tell each column apart"
        assert summary["bus_factor"][row] == pytest.approx(BUS[op](n))
        assert summary["algbw"][row] == pytest.approx(size / rankmax, rel=1e-12), (case, op)
        assert summary["busbw"][row] == pytest.approx(size / rankmax * BUS[op](n), rel=1e-12), (case, op)
        assert summary["busbw_rankmean"][row] == pytest.approx(size / rankmean * BUS[op](n), rel=1e-12), (case, op)
        if concurrent:
            assert summary["slowdown_vs_alone"][row] == pytest.approx(rankmax / alone_median[op, size], rel=1e-12)
        else:
            alone_median[op, size] = rankmax
            assert summary["slowdown_vs_alone"][row] == 1.0
    assert len(alone_median) == 4
