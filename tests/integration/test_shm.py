"""The shared-memory collectives under a real mpirun: a rank killed with SIGKILL in the middle of an shm
allreduce ends the job within the timeout, as does an error on one rank while the others wait in one, and
no shared segment of the job (the collectives' window, its registered buffers' windows, nor the MPI
library's own) is left on the machine afterwards, however the job ends; on the caller's own buffers (the
slot path) and on registered buffers (the direct path)."""
from __future__ import annotations

import os
import re
import time

import pytest

from conftest import mpirun, program

RANKS = 3
TIMEOUT = 60  # seconds; the kill must end the job well within it


def mapped_paths(stdout: str) -> dict[str, bool]:
    """Every file the ranks said they map, and whether it was already unlinked ("(deleted)") then."""
    paths = {}
    for match in re.finditer(r"^rank \d+ maps (\S+)( \(deleted\))?$", stdout, re.MULTILINE):
        paths[match.group(1)] = paths.get(match.group(1), False) or bool(match.group(2))
    return paths


@pytest.mark.parametrize("registered", [False, True], ids=["own-buffers", "registered-buffers"])
@pytest.mark.parametrize("ending", ["normal", "killed", "thrown"])
@pytest.mark.parametrize("private_dir", [False, True], ids=["dev-shm", "private-backing-dir"])
def test_a_killed_rank_ends_the_job_and_no_segment_is_left(tmp_path, ending, private_dir, registered, monkeypatch):
    # The MPI library's default backing directory, /dev/shm, where other jobs come and go; or one of our own,
    # which must be empty afterwards.
    directory = str(tmp_path / "shm") if private_dir else "/dev/shm"
    if private_dir:
        os.mkdir(directory)
        monkeypatch.setenv("OMPI_MCA_osc_sm_backing_directory", directory)
        monkeypatch.setenv("OMPI_MCA_btl_vader_backing_directory", directory)
    monkeypatch.setenv("STRATA_SHM_DIR", directory + "/")
    monkeypatch.setenv("STRATA_SHM_REGISTERED", "1" if registered else "0")
    if ending == "killed":
        monkeypatch.setenv("STRATA_SHM_KILL_RANK", "1")
    if ending == "thrown":
        monkeypatch.setenv("STRATA_SHM_THROW_RANK", "2")
    before = set(os.listdir(directory))
    start = time.monotonic()
    result = mpirun(RANKS, [program("strata-test-shm-job")], cwd=str(tmp_path), timeout=TIMEOUT)
    elapsed = time.monotonic() - start
    output = result.stdout + result.stderr

    if ending == "killed":
        assert result.returncode != 0, output[-3000:]
        assert "rank 1: killing itself in the middle of an allreduce" in result.stdout, output[-3000:]
        assert re.search(r"exited on signal 9|Killed", output), output[-3000:]
        assert elapsed < TIMEOUT / 2, f"the job took {elapsed:.1f} s to end after the kill"
    elif ending == "thrown":
        assert result.returncode != 0, output[-3000:]
        assert "rank 2: injected failure between calls; aborting" in result.stderr, output[-3000:]
        assert elapsed < TIMEOUT / 2, f"the job took {elapsed:.1f} s to end after the error"
    else:
        assert result.returncode == 0, output[-3000:]
        assert "shm job complete" in result.stdout

    # The collectives' window, and each registered buffer's, was a file of this directory, unlinked as soon as
    # every rank had mapped it.
    paths = mapped_paths(result.stdout)
    windows = [p for p in paths if os.path.basename(p).startswith("osc_sm")]
    assert len(windows) == (3 if registered else 1) and all(paths[p] for p in windows), paths
    # Nothing the job mapped is left, and nothing of the job's (its id is in every name) appeared.
    assert not [p for p in paths if os.path.exists(p)], paths
    job_id = re.search(r"osc_sm\.[^.]+\.([0-9a-f]+)\.", windows[0]).group(1)
    appeared = set(os.listdir(directory)) - before
    assert not [name for name in appeared if job_id in name or private_dir], appeared
