"""strata-report on a file strata-gemm wrote: markdown tables and valid PNG plots; errors exit 2."""
from __future__ import annotations

import struct
import subprocess
import sys

import h5py

from conftest import SCRIPTS, mpirun, program


def png_size(path):
    with open(path, "rb") as handle:
        header = handle.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", header[16:24])


def report(args, cwd):
    return subprocess.run([sys.executable, f"{SCRIPTS}/strata-report", *args], cwd=str(cwd), capture_output=True,
                          text=True, timeout=120)


def test_report_renders_tables_and_plots(tmp_path):
    out = tmp_path / "r.h5"
    run = mpirun(2, [program("strata-gemm"), "--square", "32:64", "-d", "fp32,fp64", "-n", "2", "-q",
                     "--output", str(out)], cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr
    result = report([str(out), "--out", str(tmp_path / "rep")], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "## GEMM (strata-gemm)" in result.stdout and "| cpu | fp64 | 64x64x64 |" in result.stdout
    for name in ("gemm_flops.png", "rank_spread.png"):
        assert png_size(tmp_path / "rep" / name) == (800, 500)
    assert (tmp_path / "rep" / "report.md").read_text().strip() == result.stdout.strip()


def test_report_refuses_other_files(tmp_path):
    text = tmp_path / "x.h5"
    text.write_text("hello")
    result = report([str(text)], tmp_path)
    assert result.returncode == 2 and "not an HDF5 file" in result.stderr
    other = tmp_path / "o.h5"
    with h5py.File(other, "w") as f:
        f.attrs["schema"] = "other"
    result = report([str(other)], tmp_path)
    assert result.returncode == 2 and "not a Strata results file" in result.stderr
