"""strata-merge on files the programs wrote under a real mpirun (one per "job", as Slurm jobs leave them,
an interrupted run among them): every run arrives whole, inputs are never modified, appending keeps
earlier runs, identical duplicates are skipped, clashing run ids and non-Strata or newer-major files exit 2
leaving OUT as it was, and the merged file stays a Strata file the programs and tools use."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

import strata_results as sr
from conftest import BUILD, SCRIPTS, digest, mpi_env, mpirun, program


def merge(args, cwd):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, "strata-merge"), *map(str, args)], cwd=str(cwd),
                          capture_output=True, text=True, timeout=120)


def interrupted_run(out, cwd):
    """A GEMM sweep stopped by SIGTERM after its second case (a progress line per case tells when), as Slurm stops
    a job at its time limit."""
    command = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", program("strata-gemm"),
               "--square", ",".join(["1024"] * 40), "-n", "3", "-w", "0", "--progress-interval", "0",
               "--output", str(out)]
    process = subprocess.Popen(command, cwd=str(cwd), env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    done = 0
    while done < 2:
        line = process.stderr.readline()
        assert line, "the sweep ended before reporting two cases"
        done += "done;" in line
    os.killpg(process.pid, signal.SIGTERM)
    process.communicate(timeout=120)
    return out


@pytest.fixture(scope="module")
def job_files(tmp_path_factory):
    """Three per-job files: GEMM, collective (GEMM again where strata-collective is not built), interrupted."""
    work = tmp_path_factory.mktemp("jobs")
    files = [work / "job-101.h5", work / "job-102.h5", work / "job-103.h5"]
    result = mpirun(2, [program("strata-gemm"), "--shapes", "64x64x64,96x32x48", "-n", "4", "-q", "-O", str(files[0])],
                    cwd=str(work))
    assert result.returncode == 0, result.stderr
    second = os.path.join(BUILD, "strata-collective")
    if os.access(second, os.X_OK):
        args = [second, "--collective", "allreduce,allgather", "-b", "1K", "-e", "16K", "-f", "4", "-n", "3", "-q"]
    else:
        args = [program("strata-gemm"), "--square", "32:64", "-n", "3", "-q"]
    result = mpirun(2, [*args, "-O", str(files[1])], cwd=str(work))
    assert result.returncode == 0, result.stderr
    # Two runs in one file, the second one interrupted.
    result = mpirun(2, [program("strata-gemm"), "--shapes", "16x16x16", "-n", "2", "-q", "-O", str(files[2])],
                    cwd=str(work))
    assert result.returncode == 0, result.stderr
    interrupted_run(files[2], work)
    assert sorted(sr.read_runs(str(files[2]))["status"]) == ["interrupted", "ok"]
    return files


def all_runs_intact(out, inputs):
    with h5py.File(out, "r") as merged:
        for path in inputs:
            with h5py.File(path, "r") as source:
                for run_id, group in source["runs"].items():
                    assert run_id in merged["runs"], (run_id, path)
                    assert sr.groups_equal(group, merged["runs"][run_id]), (run_id, path)


def test_merge_keeps_every_run_whole(job_files, tmp_path):
    before = [digest(str(p)) for p in job_files]
    out = tmp_path / "all.h5"
    result = merge([out, *job_files], tmp_path)
    assert result.returncode == 0, result.stderr
    assert [digest(str(p)) for p in job_files] == before  # inputs untouched
    all_runs_intact(out, job_files)
    assert len(sr.run_ids(str(out))) == 4
    with h5py.File(out, "r") as f:
        assert f.attrs["schema"] == "strata-results"
        # The newest minor version among the inputs (programs of this tree write 1.1).
        minors = {sr.schema_version(str(p))[1] for p in job_files}
        assert f.attrs["schema_version_major"] == 1 and f.attrs["schema_version_minor"] == max(minors) == 1
        assert f.attrs["created_utc"].endswith("Z")
        # Nothing beyond the runs: the same layout the programs write.
        assert list(f.keys()) == ["runs"]
    # The interrupted run came along as it was: its status and its completed cases.
    runs = sr.read_runs(str(out))
    assert sorted(runs["status"]) == ["interrupted", "ok", "ok", "ok"]
    assert "4 run(s) in all" in result.stderr


def test_append_skip_identical_and_stay_usable(job_files, tmp_path):
    out = tmp_path / "grow.h5"
    assert merge([out, job_files[0]], tmp_path).returncode == 0
    first = set(sr.run_ids(str(out)))
    result = merge([out, job_files[1], job_files[0]], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "same content; skipped" in result.stderr
    all_runs_intact(out, job_files[:2])
    assert first <= set(sr.run_ids(str(out))) and len(sr.run_ids(str(out))) == 2
    # Programs append to a merged file, and the tools read it.
    run = mpirun(2, [program("strata-gemm"), "--shapes", "8x8x8", "-n", "2", "-q", "-O", str(out)], cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr
    assert len(sr.run_ids(str(out))) == 3
    all_runs_intact(out, job_files[:2])
    report = subprocess.run([sys.executable, os.path.join(SCRIPTS, "strata-report"), str(out), "--out",
                             str(tmp_path / "rep"), "--quiet"], capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr


def test_clashing_run_ids_exit_2_and_leave_out_unchanged(job_files, tmp_path):
    out = tmp_path / "clash.h5"
    assert merge([out, job_files[0]], tmp_path).returncode == 0
    changed = tmp_path / "changed.h5"
    shutil.copyfile(job_files[0], changed)
    with h5py.File(changed, "r+") as f:
        times = list(f["runs"].values())[0]["samples/time"]
        times[0] = times[0] * 2
    unchanged = digest(str(out))
    result = merge([out, changed], tmp_path)
    assert result.returncode == 2
    assert "with different content" in result.stderr
    assert digest(str(out)) == unchanged
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".strata-merge-")]  # no temporary left behind
    # Two inputs clashing with each other: refused before OUT exists.
    fresh = tmp_path / "fresh.h5"
    assert merge([fresh, job_files[0], changed], tmp_path).returncode == 2
    assert not fresh.exists()


def test_bad_inputs_and_outputs_exit_2(job_files, tmp_path):
    text = tmp_path / "notes.h5"
    text.write_text("not hdf5")
    plain = tmp_path / "plain.h5"
    with h5py.File(plain, "w") as f:
        f.create_group("runs")
    newer = tmp_path / "newer.h5"
    shutil.copyfile(job_files[0], newer)
    with h5py.File(newer, "r+") as f:
        f.attrs["schema_version_major"] = np.int64(2)
    unversioned = tmp_path / "unversioned.h5"
    shutil.copyfile(job_files[0], unversioned)
    with h5py.File(unversioned, "r+") as f:
        del f.attrs["schema_version_major"]
    out = tmp_path / "out.h5"
    for bad, message in ((text, "is not an HDF5 file"), (plain, "not a Strata results file"),
                         (newer, "newer than this reader"), (unversioned, "without a schema version"),
                         (tmp_path / "absent.h5", "no such file")):
        result = merge([out, job_files[0], bad], tmp_path)
        assert result.returncode == 2, (bad, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr
        assert not out.exists()
    # OUT that exists must be a Strata file: appending to anything else is refused and it stays as it was.
    for target in (text, plain):
        before = digest(str(target))
        result = merge([target, job_files[0]], tmp_path)
        assert result.returncode == 2 and digest(str(target)) == before
    # OUT among the inputs: inputs are never modified.
    copy = tmp_path / "copy.h5"
    shutil.copyfile(job_files[0], copy)
    before = digest(str(copy))
    result = merge([copy, job_files[1], copy], tmp_path)
    assert result.returncode == 2 and "is also an input" in result.stderr
    assert digest(str(copy)) == before
    # An empty OUT is refused, not taken as the current folder.
    result = merge(["", job_files[0]], tmp_path)
    assert result.returncode == 2 and "OUT is an empty name" in result.stderr
