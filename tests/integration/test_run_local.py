"""`make run`'s suite (scripts/run-local.sh) end to end on two ranks: the suite's result file, this machine's system
description fitted from it, every strata-step case of the suite predicted on it in a validation file of its own (a
program never writes into a file it reads), and the report of both with its validation section."""
from __future__ import annotations

import os
import subprocess

import h5py

from conftest import BUILD, ROOT, mpi_env


def step_cases(path: str) -> int:
    with h5py.File(path, "r") as f:
        return sum(int(g["cases"].attrs["rows"]) for g in f["runs"].values() if g.attrs["benchmark"] == "strata-step")


def benchmark_runs(path: str, benchmark: str) -> int:
    with h5py.File(path, "r") as f:
        return sum(g.attrs["benchmark"] == benchmark for g in f["runs"].values())


def test_the_suite_calibrates_validates_every_step_case_and_reports_both(tmp_path):
    output, system, latest = tmp_path / "suite.h5", tmp_path / "system.json", tmp_path / "latest.json"
    env = mpi_env()
    env.update(STRATA_BUILD_DIR=BUILD, STRATA_NP="2", STRATA_ITERS="2", STRATA_PASSES="2", STRATA_OUTPUT=str(output),
               STRATA_SYSTEM=str(system), STRATA_SYSTEM_LATEST=str(latest))
    result = subprocess.run([os.path.join(ROOT, "scripts", "run-local.sh")], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "no validation" not in result.stderr and "no system description" not in result.stderr, result.stderr[-3000:]
    assert system.is_file() and latest.read_text() == system.read_text()
    validation = tmp_path / "validation-suite.h5"
    with h5py.File(validation, "r") as f:
        tables = [g["validation"] for g in f["runs"].values() if "validation" in g]
        assert len(tables) == 1
        rows = int(tables[0].attrs["rows"])
        measured = tables[0]["step_time_measured"][:rows]
        runs = tables[0]["step_runs"][:rows]
    # Two passes: every step run twice, each case validated once against the median of its two runs; the kernels at the
    # steps' shapes twice too, the general sweeps once.
    cases = step_cases(str(output))
    assert cases > 0 and rows == cases // 2, f"{rows} validated of {cases} strata-step cases over two passes"
    assert all(m > 0 for m in measured) and all(r == 2 for r in runs)
    assert benchmark_runs(str(output), "strata-step") == 8 and benchmark_runs(str(output), "strata-elementwise") == 4
    # Only the first pass prints its tables; the second runs quiet (no progress, no results line) into its log.
    def step_headers(text):
        return sum(line.startswith("# strata-step:") for line in text.splitlines())
    log = tmp_path / "suite-passes.log"
    assert step_headers(result.stdout) == 4 and step_headers(log.read_text()) == 4, result.stdout[-3000:]
    assert result.stderr.count("[strata-step] results:") == 4, result.stderr[-3000:]
    assert f"pass 2 of 2: the same runs again (their tables: the results file and {log})" in result.stderr
    assert benchmark_runs(str(output), "strata-gemm") == 2 + 2 * 2
    # The suite's file holds the benchmark runs only; the report reads both files.
    with h5py.File(output, "r") as f:
        assert all(g.attrs["benchmark"] != "strata-project" for g in f["runs"].values())
    report = (tmp_path / "suite-report" / "report.md").read_text()
    # The report is written, not printed: the programs' tables and the validation's are the output.
    assert "# Strata report" not in result.stdout and "step time error over" in result.stdout
    assert f"wrote {tmp_path / 'suite-report' / 'report.md'}" in result.stderr
    assert "### Validation: predicted against measured strata-step cases" in report
    assert f"{rows} case(s): step-time error mean absolute" in report


def test_a_bad_pass_count_is_refused_before_anything_runs(tmp_path):
    env = mpi_env()
    env.update(STRATA_BUILD_DIR=BUILD, STRATA_NP="2", STRATA_PASSES="0", STRATA_OUTPUT=str(tmp_path / "suite.h5"))
    result = subprocess.run([os.path.join(ROOT, "scripts", "run-local.sh")], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and "STRATA_PASSES must be a whole number >= 1, not '0'" in result.stderr
    assert not (tmp_path / "suite.h5").exists()
