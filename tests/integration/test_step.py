"""strata-step end to end under mpirun: every case's HDF5 records read back (bytes per tier equal to the ring
formula, model-state memory equal to the formula up to padding, activations exactly, phases that add up to
the step, a timeline, per-step metrics, FLOPs and MFU from the model's dimensions), the built-in task's loss
falling on 1 and 4 ranks, and bad input refused with exit 2 before anything is written."""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import numpy as np
import pytest

import strata_results as sr
from conftest import SCRIPTS, digest, mpirun, program

TINY = ["--model", "tiny", "--seq", "32", "--micro-batch", "2", "--accumulation", "2", "-q"]
STRATEGIES = ["NNN", "NNI", "NIG", "IIG", "ING", "GGG"]


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("step")
    out = folder / "step.h5"
    result = mpirun(4, [program("strata-step"), *TINY, "--paro", ",".join(STRATEGIES), "--group-size", "2",
                        "--comm-algo", "ring", "-w", "1", "-n", "3", "--output", str(out)], cwd=str(folder))
    assert result.returncode == 0, result.stdout + result.stderr
    return str(out), sr.run_ids(str(out))[0], result.stdout


def test_one_line_per_step_and_a_summary_per_strategy(four_ranks):
    _, _, stdout = four_ranks
    for name in STRATEGIES:
        steps = [line for line in stdout.splitlines() if line.startswith(f"{name} step ")]
        assert len(steps) == 4, stdout
        for field in ("loss", "norm", "lr", "ms", "tok/s", "MFU"):
            assert field in steps[-1]
        assert any(line.startswith(f"# {name}: step") for line in stdout.splitlines())
        ratios = [line for line in stdout.splitlines() if line.startswith(f"# {name} memory/rank, measured / formula")]
        assert len(ratios) == 1 and "activations 1.000" in ratios[0], stdout
    assert "CHECK FAILED" not in stdout


def test_bytes_per_tier_are_the_ring_formula(four_ranks):
    path, run, _ = four_ranks
    table = sr.read_cases_with_summary(path, "strata-step")
    assert list(table["strategy"]) == STRATEGIES
    assert (table["groups"] == 2).all() and (table["group_size"] == 2).all()
    for _, row in table.iterrows():
        assert row["sent_intra"] == pytest.approx(row["sent_intra_formula"], rel=1e-12), row["strategy"]
        assert row["sent_inter"] == pytest.approx(row["sent_inter_formula"], rel=1e-12), row["strategy"]
    by = table.set_index("strategy")
    # PaRO's point: NIG keeps the per-micro-batch reduction inside the node, so it sends less across nodes than
    # ZeRO-3 (GGG) does; ZeRO-3 gathers parameters twice per micro-batch, so it sends more than DP.
    assert by.loc["NIG", "sent_inter"] < by.loc["GGG", "sent_inter"]
    assert by.loc["GGG", "sent_intra"] + by.loc["GGG", "sent_inter"] > by.loc["NNN", "sent_intra"] + by.loc["NNN", "sent_inter"]


def test_memory_is_the_formula(four_ranks):
    path, run, _ = four_ranks
    table = sr.read_cases_with_summary(path, "strata-step")
    for _, row in table.iterrows():
        # units padded to a multiple of the 4 ranks: a few elements per unit and state
        slack = 4 * 4 * 4 * 3
        for category in ("parameters", "gradients"):
            assert abs(row[f"memory_{category}"] - row[f"memory_{category}_formula"]) <= slack, row["strategy"]
        assert abs(row["memory_optimizer"] - row["memory_optimizer_formula"]) <= 2 * slack
        assert row["memory_activations"] == row["memory_activations_formula"]
        assert row["memory_workspace"] == row["memory_workspace_formula"]
        assert row["memory_comm_buffers"] <= row["memory_comm_buffers_formula"]
        for category in ("parameters", "gradients", "optimizer", "activations", "workspace", "comm_buffers"):
            measured, formula, ratio = (row[f"memory_{category}{suffix}"] for suffix in ("", "_formula", "_ratio"))
            if formula > 0:
                assert ratio == pytest.approx(measured / formula, rel=1e-12), (row["strategy"], category)
            else:
                assert np.isnan(ratio), (row["strategy"], category)
        # model states within padding of the formula: a ratio within the slack's share of it
        for category in ("parameters", "gradients", "optimizer"):
            assert row[f"memory_{category}_ratio"] == pytest.approx(1, abs=2 * slack / row[f"memory_{category}_formula"])
        assert row["memory_activations_ratio"] == 1 and row["memory_workspace_ratio"] == 1
        assert np.isnan(row["memory_comm_buffers_ratio"]) or row["memory_comm_buffers_ratio"] <= 1
    memory = sr.read_run_table(path, run, "memory")
    assert set(memory["category"]) == {"parameters", "gradients", "optimizer", "activations", "workspace", "comm_buffers"}
    assert len(memory) == len(STRATEGIES) * 4 * 6
    by = table.set_index("strategy")
    assert by.loc["GGG", "memory_optimizer"] < by.loc["NNI", "memory_optimizer"] * 0.6  # G over 4 against I over 2
    # whole gradients are reduced in place in their store, whatever shards the optimizer's states
    for strategy in ("NNN", "NNI"):
        assert by.loc[strategy, "memory_comm_buffers"] == 0, strategy
        assert by.loc[strategy, "memory_comm_buffers_formula"] == 0, strategy


def test_phases_timeline_and_metrics(four_ranks):
    path, run, _ = four_ranks
    table = sr.read_cases_with_summary(path, "strata-step")
    phases = sr.read_run_table(path, run, "phases")
    samples = sr.read_run_table(path, run, "samples")
    for case in range(len(STRATEGIES)):
        for rank in range(4):
            mine = phases[(phases["case"] == case) & (phases["rank"] == rank)]
            took = samples[(samples["case"] == case) & (samples["rank"] == rank)]
            for iteration, step_time in zip(took["iteration"], took["time"]):
                it = mine[mine["iteration"] == iteration].set_index("phase")["time"]
                parts = sum(it[p] for p in ("forward", "backward", "optimizer", "comm_exposed", "idle"))
                # the sample adds the barrier-to-step gap only; the phases cover the step
                assert parts == pytest.approx(step_time, rel=0.05, abs=2e-3)
    events = sr.read_run_table(path, run, "events", where={"case": 2})  # NIG: intra and inter collectives
    assert set(events["stream"]) == {"compute", "comm"}
    assert {"intra", "inter"} <= set(events["group"])
    assert (events["end"] >= events["start"]).all()
    assert set(events["iteration"]) == {0}  # --timeline-steps 1
    metrics = sr.read_run_table(path, run, "metrics", where={"case": 0, "rank": 0})
    assert set(metrics["metric"]) >= {"loss", "grad_norm", "lr"}
    # every strategy trains the same model on the same tokens: the same losses up to fp32 summation order
    losses = table["loss_last"].to_numpy()
    assert np.allclose(losses, losses[0], rtol=1e-4)
    assert (table["mfu"] > 0).all() and (table["tokens_per_s"] > 0).all()


TINY_MAX_SEQ = 64  # the tiny preset's position table (train/model_config.cpp); not among the cases' columns


def test_flop_and_mfu_are_the_model_flops(four_ranks):
    """flop: (6N + 6Lhs) per token x the global batch's tokens / ranks, N counted here from the model's dimensions;
    mfu and hfu divide it (with the recomputed FLOPs) by the median step (max over ranks) and the peak."""
    path, _, _ = four_ranks
    table = sr.read_cases_with_summary(path, "strata-step")
    for _, row in table.iterrows():
        layers, h, heads, kv_heads, vocab, seq = (int(row[k]) for k in ("layers", "hidden", "heads", "kv_heads", "vocab", "seq"))
        qkv, mlp = (heads + 2 * kv_heads) * (h // heads), 4 * h
        per_layer = 2 * 2 * h + (qkv * h + qkv) + (h * h + h) + (mlp * h + mlp) + (h * mlp + h)
        parameters = vocab * h + TINY_MAX_SEQ * h + layers * per_layer + 2 * h
        assert row["parameters"] == parameters, row["strategy"]
        assert row["dtype"] == "fp32", row["strategy"]  # the peak is the FP32 one
        ranks = int(row["dp"] * row["tp"] * row["pp"])
        assert ranks == 4
        tokens = int(row["global_batch"]) * seq
        assert tokens == 4 * 2 * 2 * 32  # dp x accumulation x micro-batch rows of 32 tokens
        flop = (6.0 * parameters + 6.0 * layers * h * seq) * tokens / ranks
        assert row["flop"] == pytest.approx(flop, rel=1e-12), row["strategy"]
        step, peak = row["time_rankmax_median"], row["peak_per_rank"]
        assert row["mfu"] == pytest.approx(flop / (step * peak) if peak > 0 else 0.0, rel=1e-12), row["strategy"]
        assert row["hfu"] == pytest.approx((flop + row["flop_recompute"]) / (step * peak) if peak > 0 else 0.0,
                                           rel=1e-12), row["strategy"]


@pytest.mark.parametrize("ranks", [1, 4])
def test_the_built_in_task_is_learned(tmp_path, ranks):
    """Repeated random sequences over a 256-token vocabulary: the loss starts at log(256) = 5.55 and falls
    below half of it within 40 steps (measured: 2.3 at step 40 on 1 and on 4 ranks)."""
    out = tmp_path / "learn.h5"
    result = mpirun(ranks, [program("strata-step"), "--model", "tiny", "--seq", "32", "--global-batch", "8",
                            "--data", "repeat", "--lr", "3e-3", "--min-lr", "3e-3", "--zero", "3", "-w", "0", "-n", "40",
                            "-q", "--output", str(out)], cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    row = sr.read_cases_with_summary(str(out), "strata-step").iloc[0]
    assert row["loss_first"] == pytest.approx(np.log(256), rel=0.02)
    assert row["loss_last"] < 0.5 * row["loss_first"]


def test_recomputation_trains_the_same_and_holds_its_formula(tmp_path):
    """Full and selective recomputation beside keeping everything, under DP and ZeRO-3 on 2 ranks: the same
    losses at every step (the recomputed activations are the kept ones), activation memory exactly the formula
    of each mode and smallest for full, recomputation time inside backward, and hardware FLOPs above model FLOPs."""
    out = tmp_path / "recompute.h5"
    result = mpirun(2, [program("strata-step"), *TINY, "--zero", "0,3", "--recompute", "all", "-w", "1", "-n", "2",
                        "--output", str(out)], cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CHECK FAILED" not in result.stdout
    table = sr.read_cases_with_summary(str(out), "strata-step")
    assert list(table["recompute"]) == ["none", "full", "selective"] * 2
    for _, same in table.groupby("strategy"):  # bit for bit within a strategy; across them fp32 summation order
        assert (same["loss_last"] == same["loss_last"].iloc[0]).all(), same[["strategy", "recompute", "loss_last"]]
    assert np.allclose(table["loss_last"], table["loss_last"].iloc[0], rtol=1e-5)
    assert (table["memory_activations"] == table["memory_activations_formula"]).all()
    by = table[table["strategy"] == "NNN"].set_index("recompute")
    assert by.loc["full", "memory_activations"] < by.loc["selective", "memory_activations"] < by.loc["none", "memory_activations"]
    assert by.loc["none", "phase_recompute"] == 0 and by.loc["none", "flop_recompute"] == 0
    for mode in ("full", "selective"):
        assert 0 < by.loc[mode, "phase_recompute"] < by.loc[mode, "phase_backward"]
        assert by.loc[mode, "hfu"] > by.loc[mode, "mfu"]
    assert by.loc["full", "flop_recompute"] > by.loc["selective", "flop_recompute"] > 0
    events = sr.read_run_table(str(out), sr.run_ids(str(out))[0], "events", where={"case": 1})
    assert any(name.startswith("recompute ") for name in events["operation"])


def test_tensor_parallel_trains_as_data_parallel(tmp_path):
    """The same global batch on 4 ranks as tp 2 x dp 2 and on 2 ranks as dp 2: the same losses (each tensor-parallel
    rank holds its shard), memory of the shard beside the formulas, and the degrees in the cases table."""
    runs = {}
    for ranks, extra in ((4, ["--tp", "2", "--recompute", "none,full"]), (2, []), (4, ["--tp", "2", "--sp"])):
        out = tmp_path / f"tp{ranks}{'-sp' if '--sp' in extra else ''}.h5"
        result = mpirun(ranks, [program("strata-step"), *TINY, "--zero", "0,3", *extra, "-w", "0", "-n", "2",
                                "--output", str(out)], cwd=str(tmp_path))
        assert result.returncode == 0, result.stdout + result.stderr
        assert "CHECK FAILED" not in result.stdout
        runs[ranks if "--sp" not in extra else "sp"] = sr.read_cases_with_summary(str(out), "strata-step")
    tp, dp, sp = runs[4], runs[2], runs["sp"]
    assert set(tp["tp"]) == {2} and set(tp["dp"]) == {2} and set(dp["tp"]) == {1}
    assert np.allclose(tp["loss_last"], dp["loss_last"].iloc[0], rtol=1e-5)
    assert (tp["memory_activations"] == tp["memory_activations_formula"]).all()
    assert (tp["memory_parameters"] < dp["memory_parameters"].iloc[0]).all()  # half of the layers' weights
    assert set(sp["sp"]) == {1} and np.allclose(sp["loss_last"], dp["loss_last"].iloc[0], rtol=1e-5)
    assert (sp["memory_activations"] == sp["memory_activations_formula"]).all()
    assert (sp["memory_activations"] < tp[tp["recompute"] == "none"]["memory_activations"].to_numpy()).all()


def token_file(path, tokens, magic=20240520):
    header = [0] * 256
    header[0], header[1], header[2] = magic, 1, len(tokens)
    with open(path, "wb") as handle:
        handle.write(struct.pack("<256i", *header))
        handle.write(struct.pack(f"<{len(tokens)}H", *tokens))


def test_a_token_file_trains(tmp_path):
    data = tmp_path / "tokens.bin"
    token_file(data, [(7 * i) % 256 for i in range(4096)])
    result = mpirun(2, [program("strata-step"), *TINY, "--data", str(data), "-w", "0", "-n", "2",
                        "--output", str(tmp_path / "t.h5")], cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("args, message", [
    (["--paro", "NXG"], "X"),
    (["--paro", "GNN"], "GNN is not run"),
    (["--zero", "4"], "stage 4 does not exist"),
    (["--paro", "NNG", "--zero", "1"], "choose one"),
    (["--group-size", "3"], "does not divide"),
    (["--global-batch", "7"], "not divisible"),
    (["--memory-limit", "0.0000001"], "above the limit"),
    (["--trainable", "last:9"], "layers"),
    (["--data", "/nonexistent/tokens.bin"], "tokens.bin"),
    (["--backend", "cuda"], "GPU"),  # no device here, or no CUDA in the build
    (["--seq", "4096"], "position table"),
    (["--recompute", "overlapped"], "--recompute: unknown mode 'overlapped'"),
    (["--tp", "4"], "--tp 4 does not divide the 2 ranks"),
    (["--pp", "4"], "--tp 1 x --pp 4 does not divide the 2 ranks"),
    (["--pp", "2", "--layers", "3"], "do not divide into 2 pipeline stages"),
    (["--grid", "tp=2,pp=2,dp=2"], "has 8 ranks, the job 2"),
    (["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2", "--microbatches", "3"], "not a multiple"),
    (["--pp", "2", "--stage-layers", "1,2"], "adds up to 3 layers"),
    (["--pp", "2", "--stage-layers", "1,1", "--partition", "balanced"], "choose one"),
    (["--pp", "2", "--recompute", "overlap", "--recompute-policy", "/nonexistent/policy.json"], "cannot open"),
    (["--sp"], "--sp needs --tp 2 or more"),
    (["--tp", "2", "--heads", "1", "--kv-heads", "1"], "does not divide the layers"),
    (["--dtype", "fp32", "--backend", "cuda"], "the GPU step is mixed precision only"),
    (["--dtype", "bf16", "--library", "openblas"], "OpenBLAS has no bf16 GEMM"),
])
def test_bad_input_exits_2_and_leaves_the_file(tmp_path, args, message):
    out = tmp_path / "keep.h5"
    first = mpirun(2, [program("strata-step"), *TINY, "-w", "0", "-n", "1", "--output", str(out)], cwd=str(tmp_path))
    assert first.returncode == 0, first.stderr
    before = digest(str(out))
    result = mpirun(2, [program("strata-step"), *TINY, *args, "--output", str(out)], cwd=str(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr, result.stderr
    assert digest(str(out)) == before


def cpu_has_bf16_units() -> bool:
    with open("/proc/cpuinfo") as info:
        flags = info.read().split()
    return "avx512_bf16" in flags or "amx_bf16" in flags


def test_bf16_gemms_train_where_the_cpu_has_the_units_and_are_refused_elsewhere(tmp_path):
    out = tmp_path / "bf16.h5"
    result = mpirun(2, [program("strata-step"), *TINY, "--dtype", "bf16", "--data", "repeat", "-w", "0", "-n", "3",
                        "--output", str(out)], cwd=str(tmp_path))
    built_without_onednn = "this build has no oneDNN" in result.stderr
    if not cpu_has_bf16_units() or built_without_onednn:
        assert result.returncode == 2, result.stdout + result.stderr
        assert built_without_onednn or ("--dtype bf16: this CPU" in result.stderr and
                                        "no AVX-512 BF16 or AMX unit" in result.stderr), result.stderr
        assert not out.exists()
        return
    assert result.returncode == 0, result.stdout + result.stderr
    assert "GEMMs bf16 (onednn)" in result.stdout
    mfu_line = next(line for line in result.stdout.splitlines() if line.startswith("# MFU:"))
    assert "(bf16 " in mfu_line or "AMX tiles" in mfu_line, mfu_line
    losses = [float(line.split("loss ")[1].split()[0]) for line in result.stdout.splitlines() if line.startswith("NNN step ")]
    assert len(losses) == 3 and all(np.isfinite(losses)), result.stdout


def test_a_token_beyond_the_vocabulary_is_named(tmp_path):
    data = tmp_path / "bad.bin"
    token_file(data, [1, 2, 3, 300] + [5] * 2000)
    result = mpirun(2, [program("strata-step"), *TINY, "--data", str(data), "-w", "0", "-n", "1",
                        "--output", str(tmp_path / "x.h5")], cwd=str(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "300" in result.stderr and "vocab" in result.stderr
    assert not os.path.exists(tmp_path / "x.h5")


def test_report_draws_the_step_section(four_ranks, tmp_path):
    path, _, _ = four_ranks
    result = subprocess.run([sys.executable, os.path.join(SCRIPTS, "strata-report"), path, "--out", str(tmp_path), "--quiet"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "report.md").read_text()
    assert "## Training step (strata-step)" in report
    assert "Memory per rank by category: measured high-water MB / formula MB" in report
    assert "1.000" in report.split("Memory per rank by category")[1]
    for name in ("step_phases.png", "step_memory.png", "step_bytes.png", "step_timeline.png"):
        assert (tmp_path / name).stat().st_size > 10_000, name
        assert f"]({name})" in report
