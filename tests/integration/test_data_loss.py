"""No program or script writes over a file it reads, writes two outputs to one file, or replaces an HDF5 file (which
may hold results) with JSON, a trace or a report: each is refused up front, exit 2, with a message naming the flag
and the file, and every file already there is left byte for byte."""
from __future__ import annotations

import json
import os

import pytest

from conftest import ROOT, digest, mpirun, program, run_single
from result_files import gemm_file, one_error_line, script

H100 = os.path.join(ROOT, "project", "systems", "h100-sxm-ndr400.json")
PREDICT = ["--model", "tiny", "--seq", "32", "--micro-batch", "1", "--accumulation", "2", "-q"]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data-loss")
    return gemm_file(folder / "g.h5", folder)


@pytest.fixture
def files(results, tmp_path):
    """A copy of the results file and of a system description in a fresh folder, with their digests."""
    h5 = tmp_path / "g.h5"
    h5.write_bytes(results.read_bytes())
    system = tmp_path / "system.json"
    system.write_text(open(H100).read())
    return tmp_path, h5, system


def project(args, cwd):
    return run_single([program("strata-project"), *map(str, args)], cwd=str(cwd))


def refused(result, *names):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    for name in names:
        assert str(name) in result.stderr, (name, result.stderr)
    assert "Traceback" not in result.stderr


def untouched(*paths):
    return {str(p): digest(str(p)) for p in paths}


def test_calibrate_never_writes_over_the_results_it_reads(files):
    """The issue's example: `calibrate ... -o g.h5 g.h5` wrote JSON over the HDF5 file it read."""
    folder, h5, _ = files
    before = untouched(h5)
    result = project(["calibrate", h5, "-o", h5], folder)
    refused(result, "-o/--output", h5, "is also an input")
    assert untouched(h5) == before
    # The same file under another name: a hard link and a symbolic link.
    os.link(h5, folder / "hard.h5")
    os.symlink(h5, folder / "soft.json")
    for other in ("hard.h5", "soft.json"):
        result = project(["calibrate", h5, "-o", folder / other], folder)
        refused(result, "-o/--output", other, "is also an input")
    assert untouched(h5) == before


def test_json_outputs_never_replace_an_hdf5_file(files):
    folder, h5, system = files
    other = gemm_file(folder / "other.h5", folder)
    before = untouched(h5, other, system)
    result = project(["calibrate", h5, "-o", other], folder)
    refused(result, "-o/--output", other, "existing HDF5 file")
    result = project(["predict", "--system", system, *PREDICT, "--timeline", other, "-O", folder / "p.h5"], folder)
    refused(result, "--timeline", other, "existing HDF5 file")
    assert not (folder / "p.h5").exists()
    # With several predictions, every timeline file is checked: the second one is the HDF5 file here.
    taken = folder / "t-1.json"
    taken.write_bytes(other.read_bytes())
    result = project(["predict", "--system", system, *PREDICT, "--zero", "0,3", "--timeline", folder / "t.json",
                      "-O", folder / "p.h5"], folder)
    refused(result, "--timeline", taken, "existing HDF5 file")
    assert not (folder / "t-0.json").exists() and not (folder / "p.h5").exists()
    assert untouched(h5, other, system) == before


def test_project_outputs_are_never_inputs_or_each_other(files):
    folder, h5, system = files
    before = untouched(h5, system)
    cases = [
        (["predict", "--system", system, *PREDICT, "-O", system], ["-O/--output", system, "--system"]),
        (["predict", "--system", system, *PREDICT, "--timeline", system], ["--timeline", system, "--system"]),
        (["predict", "--system", system, *PREDICT, "--timeline", folder / "same", "-O", folder / "same"],
         ["--timeline", "-O/--output", "same file"]),
        (["validate", h5, "--system", system, "-O", h5], ["-O/--output", h5, "STEPFILE"]),
        (["search", "--system", system, "--model", "tiny", "--gpus", "4", "--global-batch", "8", "-O", system],
         ["-O/--output", system, "--system"]),
        (["calibrate", h5, "--base", system, "-o", system], ["-o/--output", system, "--base"]),
    ]
    for args, names in cases:
        refused(project(args, folder), *names)
    assert untouched(h5, system) == before
    assert not (folder / "same").exists()


def test_step_output_is_not_its_token_file_or_policy(files):
    folder, _, _ = files
    tokens = folder / "tokens.bin"
    header = [20240520, 1, 4096] + [0] * 253
    tokens.write_bytes(b"".join(v.to_bytes(4, "little", signed=True) for v in header) + bytes(2 * 4096))
    policy = folder / "policy.json"
    policy.write_text(json.dumps({"format": "strata-recompute-policy"}))
    before = untouched(tokens, policy)
    base = [program("strata-step"), "--model", "tiny", "--seq", "16", "-n", "1", "-w", "0", "-q"]
    result = mpirun(2, [*base, "--data", str(tokens), "-O", str(tokens)], cwd=str(folder), timeout=120)
    refused(result, "-O/--output", tokens, "--data")
    assert result.stderr.count("strata-step: error:") == 1
    result = mpirun(2, [*base, "--pp", "2", "--recompute", "overlap", "--recompute-policy", str(policy),
                        "-O", str(policy)], cwd=str(folder), timeout=120)
    refused(result, "-O/--output", policy, "--recompute-policy")
    assert untouched(tokens, policy) == before


def test_horing_json_never_replaces_an_hdf5_file(files):
    folder, h5, _ = files
    before = untouched(h5)
    result = mpirun(2, [program("strata-bench-horing"), "--smoke", "--json", str(h5)], cwd=str(folder), timeout=120)
    refused(result, "--json", h5, "existing HDF5 file")
    assert untouched(h5) == before


def test_scripts_never_write_over_their_inputs_or_results(files):
    folder, h5, _ = files
    other = gemm_file(folder / "other.h5", folder)
    before = untouched(h5, other)
    one_error_line(script("strata-trace", [h5, "-o", h5], folder), "strata-trace", h5)
    line = one_error_line(script("strata-trace", [h5, "-o", other], folder), "strata-trace", other)
    assert "existing HDF5 file" in line and "-o/--output" in line
    line = one_error_line(script("strata-compare", [h5, other, "--json", other], folder), "strata-compare", other)
    assert "--json" in line and "is also an input" in line
    line = one_error_line(script("strata-merge", [h5, other, h5], folder), "strata-merge", h5)
    assert "OUT" in line and "is also an input" in line
    # A report whose folder holds one of its inputs under a name the report writes.
    report_dir = folder / "report"
    report_dir.mkdir()
    inside = report_dir / "report.md"
    inside.write_bytes(h5.read_bytes())
    line = one_error_line(script("strata-report", [inside, "--out", report_dir, "--quiet"], folder), "strata-report",
                          inside)
    assert "is also an input" in line
    assert untouched(h5, other) == before
    assert sorted(os.listdir(report_dir)) == ["report.md"]
