"""The harness's iteration options through a whole program: --iters gives exactly that many samples per rank,
--warmup that many untimed calls of the body before them, and --max-time stops every rank after the iteration at
which the slowest rank's timed total first reaches the budget."""
from __future__ import annotations

import numpy as np

import strata_results as sr
from conftest import mpirun, program


def gemm(tmp_path, args):
    out = tmp_path / "t.h5"
    result = mpirun(2, [program("strata-gemm"), "--shapes", "96x96x96", "-q", "--output", str(out), *args],
                    cwd=str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return sr.read_table(str(out), "samples"), sr.read_cases_with_summary(str(out))


def test_iters_are_honoured(tmp_path):
    samples, summary = gemm(tmp_path, ["-n", "7", "-w", "2"])
    assert list(summary["iterations"]) == [7]
    assert sorted(samples.groupby("rank")["iteration"].apply(list).to_dict().items()) == \
        [(0, list(range(7))), (1, list(range(7)))]


def test_warmup_calls_the_body_before_the_timed_iterations(tmp_path):
    # strata-test-record-steps counts the calls the harness makes of its body (tests/programs/record_steps.cpp).
    for warmup in (0, 3):
        out = tmp_path / f"w{warmup}.h5"
        result = mpirun(2, [program("strata-test-record-steps"), "--cases", "2", "-n", "2", "-w", str(warmup), "-q",
                            "--output", str(out)], cwd=str(tmp_path), timeout=120)
        assert result.returncode == 0, result.stderr[-2000:]
        cases = sr.read_cases_with_summary(str(out))
        assert list(cases["iterations"]) == [2, 2]
        assert list(cases["body_calls"]) == [warmup + 2] * 2, f"-w {warmup}"
        assert len(sr.read_table(str(out), "samples")) == 2 * 2 * 2


def test_max_time_stops_all_ranks_at_the_budget(tmp_path):
    budget = 0.05
    samples, summary = gemm(tmp_path, ["-n", "100000", "-w", "0", "--max-time", str(budget)])
    per_rank = samples.sort_values("iteration").groupby("rank")["time"].apply(np.array)
    counts = {len(t) for t in per_rank}
    assert len(counts) == 1, "every rank ran the same number of iterations"
    iterations = counts.pop()
    assert 1 < iterations < 100000
    assert list(summary["iterations"]) == [iterations]
    # The slowest rank's total reached the budget with the last iteration, and not before it.
    assert max(t.sum() for t in per_rank) >= budget
    assert max(t[:-1].sum() for t in per_rank) < budget
