"""A run is whole or absent, case by case: `predict --timeline` into a path it cannot write appends nothing, and a job
stopped by SIGTERM or SIGINT, at several moments of a sweep, leaves every case in all of its tables or in none
(strata-collective's `groups` beside `cases`, `samples` and `summary`; strata-step's `phases`, `events`, `memory` and
`metrics` too), read back with h5py."""
from __future__ import annotations

import os
import signal
import subprocess

import h5py
import pytest

from conftest import ROOT, digest, mpi_env, program, run_single
from result_files import gemm_file, wait_for_progress

H100 = os.path.join(ROOT, "project", "systems", "h100-sxm-ndr400.json")
PREDICT = ["predict", "--system", H100, "--model", "tiny", "--seq", "32", "--micro-batch", "1", "--accumulation", "2",
           "-q"]


def test_predict_checks_every_timeline_path_before_appending(tmp_path):
    out = gemm_file(tmp_path / "results.h5", tmp_path)
    before = digest(str(out))
    for timeline in ["/proc/strata-timeline.json", str(tmp_path / "no" / "such" / "t.json"), str(tmp_path)]:
        result = run_single([program("strata-project"), *PREDICT, "--timeline", timeline, "-O", str(out)],
                            cwd=str(tmp_path))
        assert result.returncode == 2, (timeline, result.stdout, result.stderr)
        assert "--timeline" in result.stderr, result.stderr
        assert digest(str(out)) == before  # no run appended, marked ok or otherwise
    # Several predictions, one file each: a second file that cannot be written stops the first as well.
    (tmp_path / "t-1.json").mkdir()
    result = run_single([program("strata-project"), *PREDICT, "--zero", "0,3", "--timeline", str(tmp_path / "t.json"),
                         "-O", str(out)], cwd=str(tmp_path))
    assert result.returncode == 2 and "t-1.json is a directory" in result.stderr, result.stderr
    assert not (tmp_path / "t-0.json").exists()
    assert digest(str(out)) == before
    # And when every path can be written, the timelines and the run are all there.
    result = run_single([program("strata-project"), *PREDICT, "--zero", "0,3", "--timeline", str(tmp_path / "u.json"),
                         "-O", str(out)], cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "u-0.json").is_file() and (tmp_path / "u-1.json").is_file()
    with h5py.File(out, "r") as f:
        assert [f["runs"][r].attrs["status"] for r in f["runs"]] == ["ok", "ok"]


# Sweeps far longer than the moments the signals are sent at (176 cases; 14 cases of about a second each).
COLLECTIVE = ["strata-collective", "--collective", "allreduce", "-a", "ring", "-b", "4K", "-e", "4M",
              "--datatype", "float,double,int32,int8", "--redop", "sum,max", "-m", "blocking", "-n", "20", "-w", "0"]
STEP = ["strata-step", "--model", "tiny", "--seq", "32", "--micro-batch", "4", "--accumulation", "2", "--paro", "all",
        "-n", "60", "-w", "0", "--timeline-steps", "1"]
COLLECTIVE_TABLES = ["cases", "samples", "summary", "groups"]
STEP_TABLES = ["cases", "samples", "summary", "phases", "events", "memory", "metrics"]


def stop_after(program_args, out, cwd, cases_done, sig):
    command = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", program(program_args[0]),
               *program_args[1:], "--progress-interval", "0", "--output", str(out)]
    process = subprocess.Popen(command, cwd=str(cwd), env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        if cases_done:
            wait_for_progress(process, cases_done, limit=300)
        else:  # inside the first case: once the program's header, printed after its run is in the file
            header = f"# {program_args[0]}:"
            while True:
                line = process.stdout.readline()
                assert line, "the program ended before its header"
                if line.startswith(header):
                    break
        os.killpg(process.pid, sig)
        process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return process.returncode


def case_sets(path, tables):
    """Per table, the set of case indices its rows hold (rows cut to the `rows` attribute, as readers do)."""
    with h5py.File(path, "r") as f:
        (run,) = f["runs"].values()
        status = run.attrs["status"]
        status = status.decode() if isinstance(status, bytes) else status
        sets = {}
        for name in tables:
            if name not in run:
                sets[name] = set()
                continue
            group = run[name]
            rows = int(group.attrs["rows"])
            sets[name] = set(int(c) for c in group["case"][:rows])
        return status, sets


@pytest.mark.parametrize("args, tables", [(COLLECTIVE, COLLECTIVE_TABLES), (STEP, STEP_TABLES)],
                         ids=["collective", "step"])
@pytest.mark.parametrize("cases_done, sig", [(0, signal.SIGTERM), (1, signal.SIGTERM), (2, signal.SIGINT),
                                             (3, signal.SIGTERM)], ids=["first-term", "1-term", "2-int", "3-term"])
def test_a_stopped_case_is_in_all_its_tables_or_none(tmp_path, args, tables, cases_done, sig):
    out = tmp_path / "stopped.h5"
    returncode = stop_after(args, out, tmp_path, cases_done, sig)
    assert returncode != 0
    status, sets = case_sets(out, tables)
    assert status == "interrupted"
    cases = sets["cases"]
    assert all(found == cases for found in sets.values()), sets
    assert cases == set(range(len(cases)))  # completed cases, in order, none missing
    assert len(cases) >= cases_done
