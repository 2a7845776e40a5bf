"""A job that is stopped keeps every completed case, and its run says it did not finish: SIGTERM (what
Slurm sends at a time limit) closes the run as "interrupted"; SIGKILL leaves the status written at start."""
from __future__ import annotations

import os
import signal
import subprocess
import time

import strata_results as sr
from conftest import mpi_env, program

# Enough cases that the sweep is still running when the signal arrives; a progress line per case (wait_for_cases
# counts them).
SWEEP = ["--square", ",".join(["1024"] * 44), "-n", "3", "-w", "0", "--progress-interval", "0"]


def start_sweep(tmp_path, out):
    command = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", program("strata-gemm"), *SWEEP,
               "--output", str(out)]
    return subprocess.Popen(command, cwd=str(tmp_path), env=mpi_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_cases(process, count, limit=120.0):
    """Reads the progress lines until `count` cases are reported done."""
    deadline = time.monotonic() + limit
    done = 0
    while done < count and time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        if "done;" in line:
            done += 1
    assert done >= count, "the sweep did not report progress"


def test_sigterm_marks_interrupted_and_keeps_cases(tmp_path):
    out = tmp_path / "term.h5"
    process = start_sweep(tmp_path, out)
    wait_for_cases(process, 2)
    os.killpg(process.pid, signal.SIGTERM)
    process.communicate(timeout=120)
    assert process.returncode != 0
    runs = sr.read_runs(str(out))
    assert list(runs["status"]) == ["interrupted"]
    summary = sr.read_table(str(out), "summary")
    assert 2 <= len(summary) < 44
    samples = sr.read_table(str(out), "samples")
    assert set(samples["case"]) == set(summary["case"])


def test_sigkill_keeps_completed_cases(tmp_path):
    out = tmp_path / "kill.h5"
    process = start_sweep(tmp_path, out)
    wait_for_cases(process, 3)
    # As a scheduler does at a hard limit: SIGKILL to every process of the job, ranks included.
    subprocess.run(["pkill", "-KILL", "-f", str(out)], check=False)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate(timeout=60)
    # A dying process drops its file lock only at the very end of its exit.
    deadline = time.monotonic() + 30
    while True:
        try:
            runs = sr.read_runs(str(out))
            break
        except sr.StrataFileError as error:
            assert "lock" in str(error) and time.monotonic() < deadline, error
            time.sleep(0.2)
    assert list(runs["status"]) == ["interrupted"] and runs["end_utc"].iloc[0] == ""
    summary = sr.read_table(str(out), "summary")
    assert len(summary) >= 3
    assert (summary["wrong_elements"] == 0).all()
