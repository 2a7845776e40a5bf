"""A results file damaged inside (bytes flipped in a metadata structure in its second half, not truncated: HDF5 still
opens it) is named as damaged, exit 2, by every program that appends to it or reads it, and by every script that
reads it, and is left byte for byte: never MPI_ABORT, a raw HDF5 error or a traceback, and never a run appended to a
file h5py cannot walk. Unwritable outputs of the scripts are one line and exit 2 as well."""
from __future__ import annotations

import os

import pytest

from conftest import ROOT, digest, mpirun, program, run_single
from result_files import damage_inside, gemm_file, one_error_line, script, walk_failure

H100 = os.path.join(ROOT, "project", "systems", "h100-sxm-ndr400.json")


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    """A file with a strata-gemm run and a strata-step run (its events table among others)."""
    folder = tmp_path_factory.mktemp("damaged")
    path = gemm_file(folder / "runs.h5", folder)
    result = mpirun(2, [program("strata-step"), "--model", "tiny", "--seq", "16", "--micro-batch", "2", "--zero", "0,1",
                        "-n", "2", "-w", "0", "-q", "--timeline-steps", "1", "--output", str(path)], cwd=str(folder),
                    timeout=300)
    assert result.returncode == 0, result.stderr
    return path


# Kinds of damage: anywhere the first damage h5py notices past the middle, a group or chunk index, a heap of names or
# of variable-length strings, an object header.
KINDS = {
    "any": None,
    "index": ("TREE", "BTHD", "BTLF", "BTIN", "SNOD"),
    "heap": ("HEAP", "GCOL", "FRHP", "FHDB", "FHIB"),
}


@pytest.fixture(params=list(KINDS))
def damaged(request, steps, tmp_path):
    target = tmp_path / "damaged.h5"
    kind = damage_inside(steps, target, KINDS[request.param])
    assert walk_failure(target), "the damage must be one h5py notices"
    return target, kind


def assert_named_damaged(result, path, prog):
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert f"{prog}: error:" in result.stderr and str(path) in result.stderr, result.stderr
    assert "damaged" in result.stderr, result.stderr
    for raw in ("MPI_ABORT", "H5Aread failed", "HDF5 call failed", "Traceback"):
        assert raw not in result.stderr, result.stderr


def test_programs_refuse_to_append_to_a_damaged_file(damaged, tmp_path):
    path, _ = damaged
    before = digest(str(path))
    result = mpirun(2, [program("strata-gemm"), "--shapes", "8x8x8", "-n", "1", "-w", "0", "-q", "--output", str(path)],
                    cwd=str(tmp_path), timeout=120)
    assert_named_damaged(result, path, "strata-gemm")
    assert result.stderr.count("strata-gemm: error:") == 1
    result = run_single([program("strata-project"), "predict", "--system", H100, "--model", "tiny", "--seq", "32", "-q",
                         "-O", str(path)], cwd=str(tmp_path))
    assert_named_damaged(result, path, "strata-project predict")
    assert digest(str(path)) == before


def test_project_refuses_to_read_a_damaged_file(damaged, tmp_path):
    path, _ = damaged
    before = digest(str(path))
    out = tmp_path / "system.json"
    result = run_single([program("strata-project"), "calibrate", str(path), "-o", str(out)], cwd=str(tmp_path))
    assert_named_damaged(result, path, "strata-project calibrate")
    assert not out.exists()
    result = run_single([program("strata-project"), "validate", str(path), "--system", H100, "-O",
                         str(tmp_path / "v.h5")], cwd=str(tmp_path))
    assert_named_damaged(result, path, "strata-project validate")
    assert not (tmp_path / "v.h5").exists()
    assert digest(str(path)) == before


def test_scripts_name_a_damaged_input_in_one_line(damaged, steps, tmp_path):
    path, _ = damaged
    before = digest(str(path))
    for prog, args in [("strata-report", [path, "--out", tmp_path / "report", "--quiet"]),
                       ("strata-trace", [path, "-o", tmp_path / "t.json"]),
                       ("strata-compare", [steps, path]),
                       ("strata-merge", [tmp_path / "merged.h5", steps, path]),
                       ("strata-merge", [path, steps])]:
        line = one_error_line(script(prog, args, tmp_path), prog, path)
        assert "damaged" in line, line
    assert not (tmp_path / "merged.h5").exists() and not (tmp_path / "t.json").exists()
    assert digest(str(path)) == before


def test_scripts_name_an_unwritable_output_in_one_line(steps, tmp_path):
    before = digest(str(steps))
    for prog, args, named in [("strata-trace", [steps, "-o", "/proc/strata.trace.json"], "/proc"),
                              ("strata-compare", [steps, steps, "--json", "/proc/strata.json"], "/proc"),
                              ("strata-report", [steps, "--out", "/proc/strata-report", "--quiet"], "/proc"),
                              ("strata-merge", ["/proc/strata.h5", steps], "/proc"),
                              ("strata-trace", [steps, "-o", tmp_path / "no" / "such" / "t.json"], tmp_path / "no")]:
        one_error_line(script(prog, args, tmp_path), prog, named)
    assert digest(str(steps)) == before


def test_the_writer_and_the_scripts_ask_the_same_attributes_of_a_run(steps):
    """The attributes whose absence marks a run damaged are one list in C++ (schema::kRunAttributes) and in Python
    (RUN_ATTRIBUTES), and every run the programs write has them."""
    import re
    import sys

    import h5py

    sys.path.insert(0, os.path.join(ROOT, "python"))
    from strata_analysis.results import RUN_ATTRIBUTES

    with open(os.path.join(ROOT, "results", "schema.h")) as header:
        listed = re.search(r"kRunAttributes\[\] = \{([^}]*)\}", header.read())
    assert listed, "results/schema.h no longer declares kRunAttributes"
    assert tuple(re.findall(r'"([^"]+)"', listed.group(1))) == RUN_ATTRIBUTES
    with h5py.File(steps, "r") as f:
        benchmarks = set()
        for run_id, run in f["runs"].items():
            assert set(RUN_ATTRIBUTES) <= set(run.attrs), (run_id, sorted(run.attrs))
            benchmarks.add(run.attrs["benchmark"])
    assert benchmarks == {"strata-gemm", "strata-step"}, benchmarks


def test_scripts_name_a_run_without_its_attributes_and_report_without_a_cases_table(steps, tmp_path):
    """Damage HDF5 does not see: a run whose attributes were deleted, a run whose cases table was."""
    import shutil

    import h5py

    bare = tmp_path / "bare.h5"
    shutil.copyfile(steps, bare)
    with h5py.File(bare, "r+") as f:
        run = next(iter(f["runs"].values()))
        for name in list(run.attrs):
            del run.attrs[name]
    before = digest(str(bare))
    for prog, args in [("strata-report", [bare, "--out", tmp_path / "report", "--quiet"]),
                       ("strata-trace", [bare, "-o", tmp_path / "t.json"]),
                       ("strata-compare", [steps, bare]),
                       ("strata-merge", [tmp_path / "merged.h5", steps, bare])]:
        line = one_error_line(script(prog, args, tmp_path), prog, bare)
        assert "lacks the attribute(s) benchmark, status" in line, line
    # The programs append no run to it, which the scripts could read no more than the others.
    result = mpirun(2, [program("strata-gemm"), "--shapes", "8x8x8", "-n", "1", "-w", "0", "-q", "--output", str(bare)],
                    cwd=str(tmp_path), timeout=120)
    assert result.returncode == 2 and result.stderr.count("strata-gemm: error:") == 1, result.stderr
    assert "damaged Strata file: run " in result.stderr and "lacks the attribute(s) benchmark, status" in result.stderr
    result = run_single([program("strata-project"), "predict", "--system", H100, "--model", "tiny", "--seq", "32", "-q",
                         "-O", str(bare)], cwd=str(tmp_path))
    assert result.returncode == 2 and "lacks the attribute(s) benchmark, status" in result.stderr, result.stderr
    assert digest(str(bare)) == before
    # A Strata file without its runs group: refused, not opened for writing.
    no_runs = tmp_path / "no-runs.h5"
    shutil.copyfile(steps, no_runs)
    with h5py.File(no_runs, "r+") as f:
        del f["runs"]
    before = digest(str(no_runs))
    result = mpirun(2, [program("strata-gemm"), "--shapes", "8x8x8", "-n", "1", "-w", "0", "-q", "--output",
                        str(no_runs)], cwd=str(tmp_path), timeout=120)
    assert result.returncode == 2 and "is a damaged Strata file: it has no /runs group" in result.stderr, result.stderr
    assert "MPI_ABORT" not in result.stderr and digest(str(no_runs)) == before
    # A dataset where the runs group belongs: named as such by the writer and the reader alike.
    with h5py.File(no_runs, "r+") as f:
        f["runs"] = [1, 2, 3]
    before = digest(str(no_runs))
    result = mpirun(2, [program("strata-gemm"), "--shapes", "8x8x8", "-n", "1", "-w", "0", "-q", "--output",
                        str(no_runs)], cwd=str(tmp_path), timeout=120)
    assert result.returncode == 2 and "HDF5 object runs is not a group" in result.stderr, result.stderr
    result = run_single([program("strata-project"), "calibrate", str(no_runs), "-o", str(tmp_path / "s.json")],
                        cwd=str(tmp_path))
    assert result.returncode == 2 and "HDF5 object runs is not a group" in result.stderr, result.stderr
    assert digest(str(no_runs)) == before
    no_cases = tmp_path / "no-cases.h5"
    shutil.copyfile(steps, no_cases)
    with h5py.File(no_cases, "r+") as f:
        for run in f["runs"].values():
            del run["cases"]
    result = script("strata-report", [no_cases, "--out", tmp_path / "report2", "--quiet"], tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    result = script("strata-trace", [steps, "-o", ""], tmp_path)
    assert result.returncode == 2 and "-o/--output: an empty file name" in result.stderr, result.stderr
