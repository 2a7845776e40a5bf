"""strata-compare on files strata-gemm wrote under a real mpirun: an injected 20% slowdown is found (exit 1),
two halves of one run (one distribution) show no change, cases are matched across separate runs, bad
input exits 2; and the ReFrame-style reference check with its verdict stored in the file without touching
anything measured.

Derived files (a slowdown, a half of the iterations) are copies of a real file with only the `samples`
table's times or rows changed, so everything else is what the program wrote."""
from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import strata_results as sr
from conftest import SCRIPTS, digest, mpirun, program

SHAPES = "128x128x128,192x96x160"
ITERS = 30


def compare(args, cwd):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, "strata-compare"), *map(str, args)], cwd=str(cwd),
                          capture_output=True, text=True, timeout=120)


def compare_here(args, cwd):
    """strata-compare's main() in this process: the error paths without paying for scipy's import each time."""
    path = os.path.join(SCRIPTS, "strata-compare")
    loader = importlib.machinery.SourceFileLoader("strata_compare_cli", path)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    out, err = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = module.main([str(a) for a in args])
            except SystemExit as exit_:
                code = exit_.code
    finally:
        os.chdir(previous)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def gemm(out, cwd, shapes=SHAPES, iters=ITERS, extra=()):
    result = mpirun(2, [program("strata-gemm"), "--shapes", shapes, "-d", "fp32,fp64", "-n", str(iters), "-w", "2",
                        "-q", "--output", str(out), *extra], cwd=str(cwd))
    assert result.returncode == 0, result.stderr
    return out


def rewrite_samples(source, target, keep=None, scale=1.0):
    """Copies `source` to `target` keeping only the sample rows where keep(iteration) is true, times scaled."""
    shutil.copyfile(source, target)
    with h5py.File(target, "r+") as f:
        for run in f["runs"].values():
            table = run["samples"]
            iterations = table["iteration"][()]
            mask = np.ones(len(iterations), bool) if keep is None else np.array([keep(int(i)) for i in iterations])
            for name in list(table.keys()):
                data, attrs = table[name][()][mask], dict(table[name].attrs)
                if name == "time":
                    data = data * scale
                del table[name]
                ds = table.create_dataset(name, data=data, maxshape=(None,), chunks=True)
                ds.attrs.update(attrs)
            table.attrs["rows"] = np.int64(mask.sum())
    return target


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    work = tmp_path_factory.mktemp("compare")
    return gemm(work / "source.h5", work)


def json_report(tmp_path, *args):
    out = tmp_path / "cmp.json"
    result = compare([*args, "--json", out], tmp_path)
    return result, (json.loads(out.read_text()) if out.exists() else None)


def test_injected_20_percent_slowdown_is_found(source, tmp_path):
    slow = rewrite_samples(source, tmp_path / "slow.h5", scale=1.2)
    result, report = json_report(tmp_path, source, slow)
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(report["cases"]) == 4
    for case in report["cases"]:
        assert case["verdict"] == "slower" and case["regression"], case
        assert case["change"] == pytest.approx(0.2, rel=1e-9)
        assert case["p_value"] < 0.05
    assert report["geometric_mean_ratio"] == pytest.approx(1.2, rel=1e-9)
    assert "geometric mean" in result.stdout and "+20.0%" in result.stdout and "REGRESSION" in result.stdout
    assert "regressed by more than 10%" in result.stderr
    # Above the threshold only: a 20% slowdown passes a 25% threshold, still reported as slower.
    result, report = json_report(tmp_path, source, slow, "--threshold", "0.25")
    assert result.returncode == 0, result.stderr
    assert all(c["verdict"] == "slower" and not c["regression"] for c in report["cases"])


def test_one_distribution_shows_no_change(source, tmp_path):
    # Even and odd iterations of one run are two samples of one distribution (interleaved, so a drift of
    # the machine's speed during the run lands in both).
    even = rewrite_samples(source, tmp_path / "even.h5", keep=lambda i: i % 2 == 0)
    odd = rewrite_samples(source, tmp_path / "odd.h5", keep=lambda i: i % 2 == 1)
    result, report = json_report(tmp_path, even, odd)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [c["verdict"] for c in report["cases"]] == ["same"] * 4, result.stdout
    assert all(c["n_base"] == ITERS // 2 and c["n_new"] == ITERS // 2 for c in report["cases"])
    assert abs(report["geometric_mean_ratio"] - 1) < 0.1
    assert "few samples" not in result.stdout and "warning" not in result.stderr


def test_faster_is_not_a_regression(source, tmp_path):
    fast = rewrite_samples(source, tmp_path / "fast.h5", scale=1 / 1.25)
    result, report = json_report(tmp_path, source, fast)
    assert result.returncode == 0
    assert all(c["verdict"] == "faster" for c in report["cases"])


def test_few_samples_warn(source, tmp_path):
    few = rewrite_samples(source, tmp_path / "few.h5", keep=lambda i: i < 5)
    slow = rewrite_samples(few, tmp_path / "few-slow.h5", scale=1.5)
    result, report = json_report(tmp_path, few, slow)
    assert "fewer than 9 samples" in result.stderr
    assert "(few samples)" in result.stdout
    assert all(c["few_samples"] for c in report["cases"])


def test_cases_match_across_separate_runs_and_pool(source, tmp_path):
    second = gemm(tmp_path / "second.h5", tmp_path)
    # Two real runs of the same command: every case finds its partner (the noise factor is set wide, this is
    # about matching, not about the speed of a shared machine).
    result, report = json_report(tmp_path, source, second, "--noise-factor", "100")
    assert result.returncode == 0, result.stderr
    assert len(report["cases"]) == 4
    assert {(c["key"]["dtype"], c["key"]["m"]) for c in report["cases"]} == {("fp32", 128), ("fp64", 128),
                                                                               ("fp32", 192), ("fp64", 192)}
    # Several runs of one case in a file (a merged job array) are pooled.
    both = tmp_path / "both.h5"
    merge = subprocess.run([sys.executable, os.path.join(SCRIPTS, "strata-merge"), str(both), str(source), str(second)],
                           capture_output=True, text=True, timeout=120)
    assert merge.returncode == 0, merge.stderr
    result, report = json_report(tmp_path, both, source, "--noise-factor", "100")
    assert result.returncode == 0, result.stderr
    assert "pooled" in result.stderr
    assert all(c["n_base"] == 2 * ITERS and c["n_new"] == ITERS for c in report["cases"])


def test_unmatched_cases_exit_2_unless_allowed(source, tmp_path):
    other = gemm(tmp_path / "other.h5", tmp_path, shapes="128x128x128,64x64x64", iters=10)
    result = compare([source, other], tmp_path)
    assert result.returncode == 2
    assert "do not match" in result.stderr
    assert "only in BASE: strata-gemm fp32 192x96x160" in result.stderr
    assert "only in NEW:  strata-gemm fp64 64x64x64" in result.stderr
    result, report = json_report(tmp_path, source, other, "--allow-unmatched", "--noise-factor", "100")
    assert result.returncode == 0, result.stderr
    assert sorted(c["key"]["dtype"] for c in report["cases"]) == ["fp32", "fp64"]
    # Different rank counts are different cases: the same GEMM on 1 rank matches nothing on 2.
    one = tmp_path / "one.h5"
    run = mpirun(1, [program("strata-gemm"), "--shapes", SHAPES, "-d", "fp32,fp64", "-n", "10", "-q", "-O", str(one)],
                 cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert compare([source, one], tmp_path).returncode == 2
    result, report = json_report(tmp_path, source, one, "--ignore", "n_ranks", "--noise-factor", "100")
    assert result.returncode == 0 and len(report["cases"]) == 4, result.stderr


def test_bad_files_exit_2(source, tmp_path):
    text = tmp_path / "text.h5"
    text.write_text("not hdf5")
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f.attrs["something"] = "else"
    newer = tmp_path / "newer.h5"
    shutil.copyfile(source, newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["schema_version_major"] = np.int64(2)
        f.attrs["schema_version_minor"] = np.int64(0)
    for bad, message in ((text, "is not an HDF5 file"), (plain, "not a Strata results file"),
                         (newer, "schema 2.0, newer than this reader"), (tmp_path / "missing.h5", "no such file")):
        for args in ([source, bad], [bad, source]):
            result = compare_here(args, tmp_path)
            assert result.returncode == 2, (bad, result.stderr)
            assert message in result.stderr and "Traceback" not in result.stderr
    assert compare([source], tmp_path).returncode == 2  # usage error, from the command itself


# ---- reference values --------------------------------------------------------------------------------------

def measured(path, dtype, m, column):
    frame = sr.read_cases_with_summary(str(path))
    row = frame[(frame["dtype"] == dtype) & (frame["m"] == m)]
    assert len(row) == 1
    return float(row[column].iloc[0])


def reference_file(tmp_path, systems):
    path = tmp_path / "ref.json"
    path.write_text(json.dumps({"format": "strata-reference", "version": 1, "systems": systems}))
    return path


def snapshot(path):
    """Digest of every attribute and dataset of the file except reference_check tables."""
    items = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if "reference_check" in name.split("/"):
                return
            for key, value in obj.attrs.items():
                items[f"{name}@{key}"] = hashlib.sha256(repr(value).encode()).hexdigest()
            if isinstance(obj, h5py.Dataset):
                items[name] = hashlib.sha256(np.asarray(obj[()]).tobytes() if obj.dtype.kind != "O"
                                             else repr(obj[()].tolist()).encode()).hexdigest()
        f.visititems(visit)
        for key, value in f.attrs.items():
            items[f"/@{key}"] = repr(value)
    return items


def test_reference_verdict_is_stored_beside_the_results(source, tmp_path):
    target = shutil.copyfile(source, tmp_path / "checked.h5")
    rate = measured(target, "fp32", 128, "flop_rate_per_rank")
    time64 = measured(target, "fp64", 192, "time_rankmax_median")
    host = sr.run_hosts(str(target), sr.run_ids(str(target))[0])[0]
    ref = reference_file(tmp_path, {
        "elsewhere": {"hosts": ["no-such-host-[0-9]+"], "references": []},
        "here": {"hosts": [host.replace(".", r"\.")], "references": [
            # Met: the measured rate, in GFLOP/s, with 10% either way.
            {"benchmark": "strata-gemm", "case": {"dtype": "fp32", "m": 128, "n_ranks": 2},
             "metric": "flop_rate_per_rank", "reference": [rate / 1e9, -0.1, 0.1, "GFLOP/s"]},
            # Missed: a time limit of half the measured median, in ms.
            {"benchmark": "strata-gemm", "case": {"dtype": "fp64", "m": 192}, "metric": "time_rankmax_median",
             "reference": [time64 / 2 * 1e3, None, 0.0, "ms"]},
        ]},
    })
    before = snapshot(target)
    result = compare(["--reference", ref, target], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 reference check(s) failed" in result.stderr
    lines = [line for line in result.stdout.splitlines() if "strata-gemm" in line]
    assert len(lines) == 2 and "pass" in lines[0] and "FAIL" in lines[1] and "here" in lines[0]

    assert snapshot(target) == before  # nothing measured changed
    table = sr.read_table(str(target), "reference_check")
    assert list(table["verdict"]) == ["pass", "fail"]
    assert list(table["metric"]) == ["flop_rate_per_rank", "time_rankmax_median"]
    assert list(table["unit"]) == ["FLOP/s", "s"]
    assert table["value"].iloc[0] == pytest.approx(rate) and table["reference"].iloc[0] == pytest.approx(rate)
    assert table["upper_bound"].iloc[1] == pytest.approx(time64 / 2)
    assert np.isneginf(table["lower_bound"].iloc[1]) and np.isnan(table["lower_fraction"].iloc[1])
    with h5py.File(target, "r") as f:
        group = list(f["runs"].values())[0]["reference_check"]
        assert group.attrs["verdict"] == "fail" and group.attrs["system"] == "here"
        assert group.attrs["rows"] == 2 and group.attrs["reference_file"] == "ref.json"
        assert all("units" in ds.attrs for ds in group.values())
    # The file stays a valid Strata file: a program appends another run, and the reader reads it.
    gemm(target, tmp_path, shapes="32x32x32", iters=2)
    assert len(sr.run_ids(str(target))) == 2 and snapshot(target).items() >= before.items()

    # --system picks a system by name; --no-store leaves the file byte for byte as it was.
    unchanged = digest(str(target))
    result = compare(["--reference", ref, "--system", "elsewhere", "--no-store", target], tmp_path)
    assert result.returncode == 2 and "no case of the files has a reference value" in result.stderr
    result = compare(["--reference", ref, "--system", "here", "--no-store", "--allow-unmatched", target], tmp_path)
    assert result.returncode == 1
    assert digest(str(target)) == unchanged


def test_reference_errors_exit_2(source, tmp_path):
    target = shutil.copyfile(source, tmp_path / "r.h5")
    unchanged = digest(str(target))
    entry = {"benchmark": "strata-gemm", "case": {"dtype": "fp32"}, "metric": "flop_rate_per_rank",
             "reference": [1, -0.1, None, "GFLOP/s"]}
    cases = [
        ({"only": {"hosts": ["no-such-host"], "references": [entry]}}, "no system in"),
        ({"*": {"references": [{**entry, "reference": [1, 0.1, None, "GFLOP/s"]}]}}, "lower fraction must be <= 0"),
        ({"*": {"references": [{**entry, "reference": [1, -0.1, None, "B/s"]}]}}, "does not fit the column's unit"),
        ({"*": {"references": [{**entry, "metric": "no_such_metric"}]}}, "no metric column 'no_such_metric'"),
        ({"*": {"references": [{**entry, "case": {"dtype": "fp16"}}]}}, "match no case"),
        ({"*": {"references": [{**entry, "reference": [1, -0.1]}]}}, "must be [value, lower, upper, unit]"),
        ({"*": {"references": [{**entry, "reference": [float("nan"), -0.1, None, "GFLOP/s"]}]}},
         "must hold finite numbers"),
        ({"here": {"hosts": "vm", "references": [entry]}}, "\"hosts\" must be a list of host name patterns"),
    ]
    for systems, message in cases:
        result = compare_here(["--reference", reference_file(tmp_path, systems), target], tmp_path)
        assert result.returncode == 2, (systems, result.stdout, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = compare_here(["--reference", bad, target], tmp_path)
    assert result.returncode == 2 and "not valid JSON" in result.stderr
    bad.write_text(json.dumps({"systems": {}}))
    result = compare_here(["--reference", bad, target], tmp_path)
    assert result.returncode == 2 and "not a Strata reference file" in result.stderr
    result = compare_here(["--reference", target, target], tmp_path)  # a results file given as the reference
    assert result.returncode == 2 and "is not a text file" in result.stderr, result.stderr
    assert digest(str(target)) == unchanged
