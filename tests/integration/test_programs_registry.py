"""bench/programs.txt is the one registration of a program: every line names existing sources and a built
program, and the launch scripts read the same suite runs from it."""
from __future__ import annotations

import os
import subprocess
import sys

from conftest import BUILD, ROOT, registry

sys.path.insert(0, os.path.join(ROOT, "python"))
from strata_analysis.report import SECTION_NAMES  # noqa: E402  (the report's sections, one list)


def test_every_registered_program_has_sources_and_is_built():
    lines = registry()
    names = [fields[0] for fields in lines]
    assert len(names) == len(set(names)), "a program is registered twice"
    for fields in lines:
        assert len(fields) == 4, fields
        name, sources, report, runs = fields
        for source in sources.split():
            assert os.path.isfile(os.path.join(ROOT, source)), f"{name}: {source} does not exist"
        assert os.access(os.path.join(BUILD, name), os.X_OK), f"{name} is registered but not built"
        assert report in (*SECTION_NAMES, "-"), f"{name}: unknown report section {report} (strata-report draws {SECTION_NAMES})"


def suite_runs(kind: str, np: int | None = None, which: str = "") -> list[str]:
    script = f'. "{ROOT}/scripts/programs.sh"; strata_suite_runs "{ROOT}" {kind} "{np or ""}" {which}'
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.splitlines()


def test_launch_scripts_read_the_suite_runs_of_the_registry():
    expected = {(kind, np, which): [] for kind in ("cpu", "gpu") for np in (None, 2, 3)
                for which in ("all", "once", "repeated")}
    for name, _, _, runs in registry():
        if runs == "-":
            continue
        for run in runs.split(";"):
            run = run.strip()
            repeat = run.startswith("repeat:")  # a run make run repeats in each pass
            run = run[7:].strip() if repeat else run
            even = run.startswith("even:")  # a run for an even number of ranks: left out at an odd count
            run = run[5:].strip() if even else run
            kind = "gpu" if run.startswith("gpu:") else "cpu"
            run = run[4:].strip() if kind == "gpu" else run
            for np in (None, 2, 3):
                if not (even and np == 3):
                    for which in ("all", "repeated" if repeat else "once"):
                        expected[kind, np, which].append(f"{name}\t{run}")
    for (kind, np, which), runs in expected.items():
        assert suite_runs(kind, np, which) == runs, (kind, np, which)
        if which == "all":
            assert suite_runs(kind, np) == runs, (kind, np)
    # The steps and the kernels at their shapes repeat; the general sweeps run once.
    repeated = expected["cpu", None, "repeated"]
    assert sum(line.startswith("strata-step\t") for line in repeated) == 4
    assert any(line.startswith("strata-gemm\t") and "--preset tiny" in line for line in repeated)
    assert any(line.startswith("strata-gemm\t") and "--square" in line for line in expected["cpu", None, "once"])
    expected = {(kind, np): runs for (kind, np, which), runs in expected.items() if which == "all"}
    expected_cpu = expected["cpu", None]
    assert any(line.startswith("strata-step\t") and "--pp 2" in line for line in expected_cpu)
    assert len(expected["cpu", 3]) < len(expected_cpu)
    assert any(line.startswith("strata-gemm\t") for line in expected_cpu)
    variable = subprocess.run(["bash", "-c", f'. "{ROOT}/scripts/programs.sh"; strata_args_variable strata-bench-cpu-gemm'],
                              capture_output=True, text=True, check=True).stdout
    assert variable == "STRATA_BENCH_CPU_GEMM_ARGS"
