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


def test_report_renders_every_plot(tmp_path):
    out = tmp_path / "r.h5"
    runs = [
        [program("strata-gemm"), "--square", "32:64", "-d", "fp32,fp64", "-n", "2"],
        [program("strata-collective"), "--collective", "all", "-b", "64", "-e", "4K", "-f", "8", "-n", "2"],
        [program("strata-attention"), "-s", "64,128", "-H", "2", "-p", "fwd", "-n", "2"],
    ]
    for args in runs:
        run = mpirun(2, [*args, "-q", "--output", str(out)], cwd=str(tmp_path))
        assert run.returncode == 0, run.stderr
    result = report([str(out), "--out", str(tmp_path / "rep")], tmp_path)
    assert result.returncode == 0, result.stderr
    for heading in ("## GEMM (strata-gemm)", "## Collectives (strata-collective)", "## Attention (strata-attention)",
                    "## Per-rank spread"):
        assert heading in result.stdout
    assert "| cpu | fp64 | 64x64x64 |" in result.stdout
    expected = {"gemm_flops.png": (800, 500), "rank_spread.png": (800, 500), "attention_flops.png": (800, 500),
                "collective_busbw.png": (1600, 640), "collective_latency.png": (1600, 640)}
    for name, size in expected.items():
        assert png_size(tmp_path / "rep" / name) == size, name
    assert sorted(p.name for p in (tmp_path / "rep").glob("*.png")) == sorted(expected)
    assert (tmp_path / "rep" / "report.md").read_text().strip() == result.stdout.strip()


def test_report_refuses_newer_major(tmp_path):
    newer = tmp_path / "n.h5"
    with h5py.File(newer, "w") as f:
        f.attrs["schema"] = "strata-results"
        f.attrs["schema_version_major"] = 9
        f.attrs["schema_version_minor"] = 0
    result = report([str(newer)], tmp_path)
    assert result.returncode == 2 and "newer than this reader" in result.stderr


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
    # Empty names: an input, and the folder to write (not taken as "the default").
    result = report([""], tmp_path)
    assert result.returncode == 2 and "an empty file name" in result.stderr, result.stderr
    result = report([str(other), "--out", ""], tmp_path)
    assert result.returncode == 2 and "--out: an empty folder name" in result.stderr, result.stderr
