"""Two programs appending to one results file at once: the second waits for the first (STRATA_LOCK_WAIT seconds,
default 30) and then appends, or refuses with "in use by another writer", exit 2, the file untouched: never
"damaged". Two real concurrent runs, and a test helper holding the file open for writing as another program would."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

import strata_results as sr
from conftest import ROOT, digest, mpi_env, mpirun, program, run_single
from result_files import Holder, gemm_file, one_error_line, script, wait_for_progress

H100 = os.path.join(ROOT, "project", "systems", "h100-sxm-ndr400.json")
# Enough work that the first run is still writing when the second starts and after the second's 1 s wait ends:
# 30 cases of 1024^3 (about 3 s on a 2-core VM, more when loaded; 512^3 finished within the wait on a fast one).
LONG_SIZE = "1024"
LONG = ["--square", ",".join([LONG_SIZE] * 30), "-n", "4", "-w", "0"]
SHORT = ["--shapes", "8x8x8", "-n", "1", "-w", "0"]


def gemm(args, out, cwd, wait=None, timeout=300):
    env = mpi_env()
    if wait is not None:
        env["STRATA_LOCK_WAIT"] = str(wait)
    command = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", program("strata-gemm"), *args,
               "--output", str(out)]
    return subprocess.run(command, cwd=str(cwd), env=env, capture_output=True, text=True, timeout=timeout)


def start_long(out, cwd):
    command = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", program("strata-gemm"), *LONG,
               "--output", str(out)]
    return subprocess.Popen(command, cwd=str(cwd), env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def test_second_writer_waits_for_the_first_then_appends(tmp_path):
    out = gemm_file(tmp_path / "shared.h5", tmp_path)
    first = start_long(out, tmp_path)
    try:
        wait_for_progress(first, 1)
        second = gemm(SHORT, out, tmp_path, wait=300)
        first_err = first.communicate(timeout=300)[1]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0, first_err
    assert second.returncode == 0, second.stderr
    assert "in use by another writer" in second.stderr and "waiting up to 300 s" in second.stderr
    assert "damaged" not in second.stderr
    runs = sr.read_runs(str(out)).sort_values("end_utc")
    assert list(runs["status"]) == ["ok", "ok", "ok"]
    # The second run was written after the first had ended: its end is the last, and its only case is whole.
    long_run = runs[runs["config_json"].str.contains(LONG_SIZE)]
    assert len(long_run) == 1 and runs["end_utc"].iloc[-1] > long_run["end_utc"].iloc[0]
    summary = sr.read_table(str(out), "summary")
    assert sorted(summary.groupby("run_id").size()) == [1, 1, 30]


def test_second_writer_refuses_after_its_wait_and_leaves_the_file(tmp_path):
    out = gemm_file(tmp_path / "shared.h5", tmp_path)
    first = start_long(out, tmp_path)
    try:
        wait_for_progress(first, 1)
        started = time.monotonic()
        second = gemm(SHORT, out, tmp_path, wait=1)
        waited = time.monotonic() - started
        first_err = first.communicate(timeout=300)[1]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert second.returncode == 2, second.stderr
    assert "strata-gemm: error: output file" in second.stderr and str(out) in second.stderr
    assert "in use by another writer" in second.stderr and "STRATA_LOCK_WAIT" in second.stderr
    assert "damaged" not in second.stderr
    assert waited >= 1.0
    assert first.returncode == 0, first_err
    runs = sr.read_runs(str(out))
    assert list(runs["status"]) == ["ok", "ok"]  # the file's first run and the long one; nothing of the second


def test_a_held_file_is_waited_for_then_refused_untouched(tmp_path):
    out = gemm_file(tmp_path / "held.h5", tmp_path)
    before = digest(str(out))
    with Holder(out):
        result = gemm(SHORT, out, tmp_path, wait=0)
        assert result.returncode == 2 and "in use by another writer" in result.stderr, result.stderr
        result = run_single([program("strata-project"), "predict", "--system", H100, "--model", "tiny", "--seq", "32",
                             "-q", "-O", str(out)], cwd=str(tmp_path), timeout=120)
        assert result.returncode == 2 and "in use by another writer" in result.stderr, result.stderr
        # Readers refuse at once, naming the file and the writer, never "damaged".
        result = run_single([program("strata-project"), "calibrate", str(out), "-o", str(tmp_path / "s.json")],
                            cwd=str(tmp_path), timeout=120)
        assert result.returncode == 2 and "in use by another writer" in result.stderr, result.stderr
        line = one_error_line(script("strata-report", [out, "--out", tmp_path / "r", "--quiet"], tmp_path),
                              "strata-report", out)
        assert "in use by another writer" in line
        env = dict(os.environ, STRATA_LOCK_WAIT="0.5")
        line = one_error_line(script("strata-merge", [out, gemm_file(tmp_path / "more.h5", tmp_path)], tmp_path,
                                     env=env), "strata-merge", out)
        assert "in use by another writer" in line
    assert digest(str(out)) == before


def test_a_held_file_is_appended_to_once_released(tmp_path):
    out = gemm_file(tmp_path / "held.h5", tmp_path)
    holder = Holder(out, seconds=3)
    started = time.monotonic()
    result = gemm(SHORT, out, tmp_path)  # the default wait, 30 s
    holder.stop()
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 2
    assert "waiting up to 30 s" in result.stderr
    assert list(sr.read_runs(str(out))["status"]) == ["ok", "ok"]
    more = gemm_file(tmp_path / "more.h5", tmp_path)
    holder = Holder(out, seconds=3)
    merged = script("strata-merge", [out, more], tmp_path)
    holder.stop()
    assert merged.returncode == 0, merged.stderr
    assert "waiting up to 30 s" in merged.stderr
    assert len(sr.read_runs(str(out))) == 3


@pytest.mark.parametrize("value", ["abc", "-1", "nan"])
def test_a_bad_lock_wait_is_named(tmp_path, value):
    out = gemm_file(tmp_path / "r.h5", tmp_path)
    before = digest(str(out))
    result = gemm(SHORT, out, tmp_path, wait=value)
    assert result.returncode == 2 and f"STRATA_LOCK_WAIT={value}" in result.stderr, result.stderr
    assert digest(str(out)) == before
