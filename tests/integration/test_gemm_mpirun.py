"""strata-gemm under a real mpirun with 2 ranks, its HDF5 file read back with h5py: schema, run metadata,
context, the four tables with units, and the numbers' internal consistency."""
from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

import strata_results as sr
from conftest import digest, mpirun, program

SHAPES = "64x48x96,33x17x65"
ITERS = 4


@pytest.fixture(scope="module")
def gemm_file(tmp_path_factory):
    work = tmp_path_factory.mktemp("gemm")
    out = work / "gemm.h5"
    result = mpirun(2, [program("strata-gemm"), "--shapes", SHAPES, "-d", "fp32,fp64", "-n", str(ITERS), "-w", "1",
                        "--output", str(out)], cwd=str(work))
    assert result.returncode == 0, result.stderr
    return out, result


def only_run(f: h5py.File):
    runs = list(f["runs"].values())
    assert len(runs) == 1
    return runs[0]


def test_stdout_table_and_progress(gemm_file):
    _, result = gemm_file
    rows = [line for line in result.stdout.splitlines() if line.strip().startswith("cpu")]
    assert len(rows) == 4
    assert all(row.split()[-1] == "ok" for row in rows)
    assert "GFLOP/s" in result.stdout and "2MNK" in result.stdout
    assert "case 4/4" in result.stderr


@pytest.mark.parametrize("interval, expected", [("3600", [1, 12]), ("0", list(range(1, 13)))])
def test_progress_lines_the_first_and_last_case_and_one_an_interval(tmp_path, interval, expected):
    # Twelve cases of well under a second: an hour's interval leaves the first and the last line (ProgressLines.* in
    # the unit tests hold the lines between).
    result = mpirun(2, [program("strata-gemm"), "--square", ",".join(["32"] * 12), "-n", "2", "-w", "0",
                        "--progress-interval", interval, "--output", str(tmp_path / "gemm.h5")], cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    done = [int(line.split("case ")[1].split("/")[0]) for line in result.stderr.splitlines() if " done; " in line]
    assert done == expected, result.stderr


def test_schema_and_run_attributes(gemm_file):
    path, _ = gemm_file
    with h5py.File(path, "r") as f:
        assert f.attrs["schema"] == "strata-results"
        assert f.attrs["schema_version_major"] == 1
        run = only_run(f)
        a = run.attrs
        assert a["benchmark"] == "strata-gemm"
        assert a["status"] == "ok"
        assert a["launcher"] == "mpirun"
        assert a["n_ranks"] == "2" and a["n_nodes"] == "1" and a["ranks_per_node"] == "2"
        assert "--shapes" in a["command_line"]
        config = json.loads(a["config_json"])
        assert config["shapes"] == SHAPES and config["iters"] == ITERS and config["blas-threads"] == 1
        assert config["progress-interval"] == 10  # seconds, the default
        assert a["start_utc"] < a["end_utc"]
        env = run["env"].attrs
        for key in ("mpi_library", "hdf5", "blas_config", "blas_corename", "compiler", "cxx_flags", "git_commit",
                    "load_average_at_start", "oversubscribed", "hosts", "cuda_runtime"):
            assert key in env, key
        assert "Open MPI" in env["mpi_library"]
        assert env["blas_threads_per_rank"] == "1"


def test_tables_have_units_and_consistent_rows(gemm_file):
    path, _ = gemm_file
    with h5py.File(path, "r") as f:
        run = only_run(f)
        for table in ("cases", "samples", "summary", "ranks"):
            assert table in run, table
            for name, ds in run[table].items():
                assert ds.ndim == 1, (table, name)
                assert "units" in ds.attrs, (table, name)
        assert run["samples/time"].attrs["units"] == "s"
        assert run["summary/flop_rate_per_rank"].attrs["units"] == "FLOP/s"
        assert "convention" in run["summary/flop_rate_aggregate"].attrs
        n_cases = len(run["cases/case"])
        assert n_cases == 4
        assert len(run["samples/time"]) == n_cases * 2 * ITERS
        ranks = run["ranks"]
        assert list(ranks["rank"][()]) == [0, 1]
        assert list(ranks["local_rank"][()]) == [0, 1]
        assert all(d == b"cpu" for d in ranks["device"][()])


def test_summary_matches_samples(gemm_file):
    path, _ = gemm_file
    summary = sr.read_table(str(path), "summary")
    samples = sr.read_table(str(path), "samples")
    cases = sr.read_table(str(path), "cases")
    assert set(summary["benchmark"]) == {"strata-gemm"}
    for case, group in samples.groupby("case"):
        times = group.pivot(index="iteration", columns="rank", values="time")
        row = summary[summary["case"] == case].iloc[0]
        assert row["time_rankmax_median"] == pytest.approx(np.median(times.max(axis=1)))
        assert row["time_rankmean_median"] == pytest.approx(np.median(times.mean(axis=1)))
        assert row["time_rankmax_p95"] == pytest.approx(np.percentile(times.max(axis=1), 95))
        assert row["time_rankmax_median"] >= row["time_rankmean_median"]
        c = cases[cases["case"] == case].iloc[0]
        assert c["flop"] == 2 * c["m"] * c["n"] * c["k"]
        assert row["flop_rate_per_rank"] == pytest.approx(c["flop"] / row["time_rankmean_median"])
        assert row["flop_rate_aggregate"] == pytest.approx(2 * c["flop"] / row["time_rankmax_median"])
        assert row["wrong_elements"] == 0 and row["check_worst_ratio"] <= 1
        assert row["peak_per_rank"] > 0 and row["peak_source"].startswith("measured: ")


def test_append_keeps_earlier_runs(gemm_file, tmp_path):
    path, _ = gemm_file
    copy = tmp_path / "copy.h5"
    copy.write_bytes(path.read_bytes())
    before = sr.read_table(str(copy), "samples")
    result = mpirun(2, [program("strata-gemm"), "--shapes", "16x16x16", "-n", "2", "--output", str(copy), "-q"],
                    cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    runs = sr.read_runs(str(copy))
    assert len(runs) == 2 and list(runs["status"]) == ["ok", "ok"]
    after = sr.read_table(str(copy), "samples")
    first = after[after["run_id"] == before["run_id"].iloc[0]].reset_index(drop=True)
    assert first.drop(columns=["file"]).equals(before.drop(columns=["file"]))


def test_cases_with_summary_join(gemm_file):
    path, _ = gemm_file
    data = sr.read_cases_with_summary(str(path), "strata-gemm")
    assert len(data) == 4
    assert {"m", "dtype", "flop_rate_per_rank", "n_ranks", "status"} <= set(data.columns)
    assert data.attrs["units"]["flop_rate_aggregate"] == "FLOP/s"


def test_default_output_goes_to_results_runs(tmp_path):
    result = mpirun(2, [program("strata-gemm"), "--shapes", "8x8x8", "-n", "1", "-q"], cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    files = os.listdir(tmp_path / "results" / "runs")
    assert len(files) == 1 and files[0].startswith("strata-gemm-") and files[0].endswith(".h5")
