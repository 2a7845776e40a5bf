"""Bad input to strata-gemm: a message naming the problem, exit code 2, and any existing file left
byte-for-byte unchanged. Runs under mpirun with 2 ranks, as users run it."""
from __future__ import annotations

import os

import h5py
import pytest

from conftest import digest, mpirun, program


def run_gemm(args, cwd):
    return mpirun(2, [program("strata-gemm"), "-n", "1", "-q", *args], cwd=str(cwd), timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--bogus"], "unknown flag --bogus"),
    (["--shapes", "64x64"], "malformed shape '64x64'"),
    (["--shapes", "64xAx64"], "expected an integer"),
    (["--shapes", "0x64x64"], "M must be positive"),
    (["--shapes", "64x-8x64"], "N must be positive"),
    (["--square", "0:64"], "expected 0 < START <= END"),
    (["--dtype", "bf16"], "dtype bf16 is not available on the cpu backend"),
    (["--dtype", "fp128"], "unknown dtype 'fp128'"),
    (["--backend", "tpu"], "expected one of cpu|cuda"),
    (["--iters", "0"], "--iters must be between 1"),
    (["--preset", "gpt9"], "unknown preset 'gpt9'"),
    (["--preset", "gpt2-small", "--tp", "7"], "does not divide"),
])
def test_usage_errors_exit_2(tmp_path, args, message):
    result = run_gemm(args, tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert result.stderr.count("strata-gemm: error:") == 1  # printed once, by rank 0
    assert not (tmp_path / "results").exists()  # nothing written


def test_output_is_a_directory(tmp_path):
    result = run_gemm(["--output", str(tmp_path)], tmp_path)
    assert result.returncode == 2
    assert "is a directory" in result.stderr


def test_output_folder_missing_or_read_only(tmp_path):
    result = run_gemm(["--output", str(tmp_path / "no" / "such" / "r.h5")], tmp_path)
    assert result.returncode == 2 and "does not exist" in result.stderr
    result = run_gemm(["--output", "/proc/strata-results.h5"], tmp_path)
    assert result.returncode == 2 and "not writable" in result.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to files without write permission")
def test_output_file_not_writable(tmp_path):
    target = tmp_path / "locked.h5"
    ok = run_gemm(["--shapes", "8x8x8", "--output", str(target)], tmp_path)
    assert ok.returncode == 0
    target.chmod(0o444)
    before = digest(str(target))
    result = run_gemm(["--output", str(target)], tmp_path)
    assert result.returncode == 2 and "not writable" in result.stderr
    assert digest(str(target)) == before


def test_output_not_hdf5_is_untouched(tmp_path):
    target = tmp_path / "notes.h5"
    target.write_text("my notes, not HDF5\n")
    before = digest(str(target))
    result = run_gemm(["--output", str(target)], tmp_path)
    assert result.returncode == 2 and "is not an HDF5 file" in result.stderr
    assert digest(str(target)) == before


def test_output_other_schema_is_untouched(tmp_path):
    target = tmp_path / "other.h5"
    with h5py.File(target, "w") as f:
        f.attrs["schema"] = "someone-else"
        f["data"] = [1, 2, 3]
    before = digest(str(target))
    result = run_gemm(["--output", str(target)], tmp_path)
    assert result.returncode == 2 and "not a Strata results file" in result.stderr
    assert digest(str(target)) == before


def test_output_newer_major_is_untouched(tmp_path):
    target = tmp_path / "future.h5"
    with h5py.File(target, "w") as f:
        f.attrs["schema"] = "strata-results"
        f.attrs["schema_version_major"] = 2
        f.attrs["schema_version_minor"] = 0
        f.create_group("runs")
    before = digest(str(target))
    result = run_gemm(["--output", str(target)], tmp_path)
    assert result.returncode == 2 and "newer than this program" in result.stderr
    assert digest(str(target)) == before


def test_output_truncated_hdf5_is_untouched(tmp_path):
    target = tmp_path / "cut.h5"
    first = run_gemm(["--shapes", "16x16x16", "--output", str(target)], tmp_path)
    assert first.returncode == 0, first.stderr
    # Half a file: the HDF5 signature is still there, the objects it points to are not.
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    before = digest(str(target))
    result = run_gemm(["--output", str(target)], tmp_path)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "damaged HDF5 file" in result.stderr
    assert digest(str(target)) == before
