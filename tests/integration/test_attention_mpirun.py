"""strata-attention under a real mpirun with 2 ranks: every case checked against float64, the FLOP
convention stored and applied, grouped-query and causal shapes with ragged lengths, and bad input."""
from __future__ import annotations

import pytest

import strata_results as sr
from conftest import mpirun, program


def attention(args, tmp_path, name="a.h5"):
    out = tmp_path / name
    result = mpirun(2, [program("strata-attention"), "-q", "--output", str(out), *args], cwd=str(tmp_path))
    return result, out


def test_cases_checked_and_flops_follow_flash_attention(tmp_path):
    result, out = attention(["-s", "100", "--seq-kv", "100,157", "-H", "8", "--kv-heads", "2", "-D", "64,128",
                             "-p", "fwd,bwd,fwdbwd", "-n", "2", "-w", "1"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = sr.read_cases_with_summary(str(out), "strata-attention")
    assert len(data) == 2 * 2 * 2 * 3 * 2  # seq_kv x dims x causal x passes x impls
    assert (data["wrong_elements"] == 0).all() and (data["check_rel_l2"] < 1e-4).all()
    for _, row in data.iterrows():
        fwd = 4 * row["batch"] * row["heads_q"] * row["seq_q"] * row["seq_kv"] * row["head_dim"]
        fwd /= 2 if row["causal"] else 1
        assert row["flop"] == pytest.approx({"fwd": fwd, "bwd": 2.5 * fwd, "fwdbwd": 3.5 * fwd}[row["pass"]])
        assert row["flop_rate_per_rank"] == pytest.approx(row["flop"] / row["time_rankmean_median"])
    assert set(data["heads_kv"]) == {2} and set(data["seq_kv"]) == {100, 157}


def test_table_on_stdout(tmp_path):
    result, _ = attention(["-s", "64", "-H", "2", "-n", "1", "-p", "fwd"], tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.strip().startswith(("flash", "naive"))]
    assert len(rows) == 4 and "GFLOP/s" in result.stdout and "flash-attention convention" in result.stdout


@pytest.mark.parametrize("args, message", [
    (["-H", "6", "--kv-heads", "4"], "must be a multiple of heads_kv"),
    (["-s", "0"], "--seq must be positive"),
    (["--dtype", "bf16"], "not available on the cpu backend"),
    (["--dtype", "foo"], "--dtype foo: unknown element type"),
    (["--impl", "cudnn"], "unknown implementation 'cudnn'"),
    (["--pass", "sideways"], "unknown pass 'sideways'"),
    (["--bogus"], "unknown flag --bogus"),
])
def test_bad_input_exits_2(tmp_path, args, message):
    result, out = attention(args, tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not out.exists()
