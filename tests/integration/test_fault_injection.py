"""A wrong result must fail the run. Each program takes --inject-wrong-element RANK (a testing option): that
rank corrupts one output element of every case after the checked run and before its check. The exit code,
the message, the run's status and the wrong-element counts in the file must all say so; the same command
without the injection passes, so the failure comes from the check and nothing else."""
from __future__ import annotations

import pytest

import strata_results as sr
from conftest import mpirun, program

# Tiny cases of each program on the CPU (the CUDA and NCCL paths take the same option but need a GPU).
# The GEMM check samples only the four corners (--check-samples 4), so the corrupted corner counts once.
PROGRAMS = {
    "strata-gemm": ["--shapes", "9x7x5,16x8x24", "-d", "fp32,fp64", "--check-samples", "4"],
    "strata-attention": ["-s", "16", "-H", "2", "--kv-heads", "1", "-D", "8", "--causal", "both", "-p", "fwd,bwd",
                         "--impl", "flash,naive"],
    "strata-collective": ["--collective", "all", "-a", "all", "-d", "float,int8", "-b", "48", "-e", "48"],
    "strata-elementwise": ["--preset", "tiny", "--tokens", "16"],
}


def run_program(name, tmp_path, inject):
    out = tmp_path / f"{name}-{inject}.h5"
    args = [program(name), *PROGRAMS[name], "-n", "1", "-w", "0", "--output", str(out)]
    if inject is not None:
        args += ["--inject-wrong-element", str(inject)]
    return mpirun(2, args, cwd=str(tmp_path), timeout=120), out


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("inject", [0, 1, -2])  # rank 0, rank 1, every rank
def test_one_wrong_element_fails_the_run(tmp_path, name, inject):
    result, out = run_program(name, tmp_path, inject)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "OUTPUT CHECK FAILED" in result.stderr
    runs = sr.read_runs(str(out))
    assert list(runs["status"]) == ["failed"]
    data = sr.read_cases_with_summary(str(out))
    assert len(data) > 0
    # One element per case on each corrupting rank, summed over ranks; the other outputs are right. A
    # reduce's result exists on its root (rank 0) only, so a corruption elsewhere leaves nothing to see there.
    ranks = [0, 1] if inject == -2 else [inject]
    operations = data["operation"] if name == "strata-collective" else [""] * len(data)
    expected = [sum(1 for r in ranks if not (op == "reduce" and r != 0)) for op in operations]
    assert list(data["wrong_elements"]) == expected


def test_quiet_still_reports_a_failed_check(tmp_path):
    out = tmp_path / "quiet.h5"
    args = [program("strata-gemm"), *PROGRAMS["strata-gemm"], "-n", "1", "-w", "0", "--output", str(out), "--quiet",
            "--inject-wrong-element", "1"]
    result = mpirun(2, args, cwd=str(tmp_path), timeout=120)
    assert result.returncode == 1 and "OUTPUT CHECK FAILED" in result.stderr, result.stderr[-2000:]
    assert "[strata-gemm] case" not in result.stderr  # the progress lines stay quiet


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_same_run_without_injection_passes(tmp_path, name):
    result, out = run_program(name, tmp_path, None)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "OUTPUT CHECK FAILED" not in result.stderr
    assert list(sr.read_runs(str(out))["status"]) == ["ok"]
    assert (sr.read_cases_with_summary(str(out))["wrong_elements"] == 0).all()


def test_the_failed_case_is_marked_on_stdout(tmp_path):
    result, _ = run_program("strata-gemm", tmp_path, 1)
    rows = [line.split() for line in result.stdout.splitlines() if line.strip().startswith("cpu")]
    assert rows and all(row[-1] == "FAIL" for row in rows)


def test_mixed_pattern_counts_the_wrong_allreduce(tmp_path):
    out = tmp_path / "mixed.h5"
    result = mpirun(2, [program("strata-collective"), "--grid", "tp=2", "--mixed", "-b", "64", "-e", "64", "-n", "1",
                        "-w", "0", "--inject-wrong-element", "1", "--output", str(out)], cwd=str(tmp_path), timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    data = sr.read_cases_with_summary(str(out))
    assert list(sr.read_runs(str(out))["status"]) == ["failed"]
    by_op = data.groupby("operation")["wrong_elements"].apply(list).to_dict()
    assert by_op == {"allreduce": [1, 1], "reduce_scatter": [0, 0]}


def test_a_failed_attention_check_names_the_tensor_and_element(tmp_path):
    result, _ = run_program("strata-attention", tmp_path, 1)
    lines = [line for line in result.stderr.splitlines() if "check failed" in line]
    # Each of the 8 cases on rank 1, naming O (the corrupted tensor) with its bad count and where its worst element is.
    assert len(lines) == 8, result.stderr[-2000:]
    assert all(line.startswith("strata-attention: rank 1: ") and "o rel_l2" in line and "bad 1 (worst" in line
               for line in lines), lines
