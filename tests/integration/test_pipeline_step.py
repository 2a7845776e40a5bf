"""strata-step on a pipeline (tp 1 x pp 2 on 2 ranks, tp 2 x pp 2 on 4) end to end under mpirun: the pipeline's
columns read back with their units, the bubble's formula (p - 1) / (v m), the bytes sent to other stages equal to
their formula, phases that add up to the step, activations and workspace exactly their formulas, every recomputation
mode on the losses of keeping everything, hardware FLOPs above model FLOPs where something is recomputed, the stored
placement of `--recompute overlap` read back by `--recompute-policy` to the same losses, the report's pipeline plots
(and a file from before these columns still rendering), and bad grids, splits and policy files refused with exit 2
before anything is written."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

import strata_results as sr
from conftest import SCRIPTS, digest, mpirun, program

# Four layers: two stages of two, or of one chunk each under interleaving; m = 4 micro-batches.
TINY = ["--model", "tiny", "--layers", "4", "--seq", "32", "--micro-batch", "2", "--microbatches", "4", "-q"]
MODES = ["none", "full", "selective", "overlap"]
PIPELINE_SUMMARY = {"bubble_fraction": "1", "bubble_fraction_formula": "1", "sent_pipeline": "B",
                    "sent_pipeline_formula": "B", "recompute_exposed": "s", "placement_exposed": "s",
                    "placement_search": "s", "heuristic_gap": "1", "phase_pipeline_wait": "s",
                    "phase_recompute_window": "s", "phase_recompute_hidden": "s", "hfu": "1", "mfu": "1"}
PIPELINE_CASES = {"pp": "1", "virtual_stages": "1", "schedule": "", "partition": "", "stage_layers": "1",
                  "recompute_policy": ""}


def step_run(ranks, args, folder, out):
    result = mpirun(ranks, [program("strata-step"), *TINY, *args, "--output", str(out)], cwd=str(folder))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CHECK FAILED" not in result.stdout, result.stdout
    return sr.read_cases_with_summary(str(out), "strata-step")


@pytest.fixture(scope="module")
def two_stages(tmp_path_factory):
    """tp 1 x pp 2 on Strata's ring (so bytes are counted): 1F1B in every recomputation mode, then interleaved 1F1B
    (two chunks per rank) without and with overlapped recomputation, into one file."""
    folder = tmp_path_factory.mktemp("pipeline")
    out = folder / "pp2.h5"
    common = ["--pp", "2", "--comm-algo", "ring", "-w", "1", "-n", "2"]
    step_run(2, [*common, "--recompute", "all"], folder, out)
    table = step_run(2, [*common, "--schedule", "interleaved", "--virtual-stages", "2", "--recompute", "none,overlap"], folder, out)
    return str(out), table, folder


def one_f_one_b(table):
    return table[table["schedule"] == "1f1b"].set_index("recompute")


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """tp 2 x pp 2 on 4 ranks, none and overlap."""
    folder = tmp_path_factory.mktemp("pipeline4")
    out = folder / "tp2pp2.h5"
    table = step_run(4, ["--grid", "tp=2,pp=2", "--recompute", "none,full,overlap", "-w", "1", "-n", "2"], folder, out)
    return str(out), table


def test_the_pipeline_columns_are_stored_with_units(two_stages, four_ranks):
    for path, table in (two_stages[:2], four_ranks):
        summary, cases = sr.column_units(path, "summary"), sr.column_units(path, "cases")
        for column, unit in PIPELINE_SUMMARY.items():
            assert summary.get(column) == unit, (column, summary.get(column))
        for column, unit in PIPELINE_CASES.items():
            assert cases.get(column) == unit, (column, cases.get(column))
        assert set(table["pp"]) == {2}
    assert list(two_stages[1]["recompute"]) == [*MODES, "none", "overlap"]
    assert list(two_stages[1]["schedule"]) == ["1f1b"] * 4 + ["interleaved"] * 2
    assert list(two_stages[1]["virtual_stages"]) == [1] * 4 + [2] * 2
    assert set(four_ranks[1]["schedule"]) == {"1f1b"}
    assert set(four_ranks[1]["tp"]) == {2} and set(four_ranks[1]["dp"]) == {1}


def test_bubble_formula_and_bytes_to_other_stages(two_stages, four_ranks):
    for _, table in (two_stages[:2], four_ranks):
        for _, row in table.iterrows():
            p, v, m = row["pp"], row["virtual_stages"], row["accumulation"]
            assert row["bubble_fraction_formula"] == pytest.approx((p - 1) / (v * m), rel=1e-12)
            assert row["sent_pipeline"] == pytest.approx(row["sent_pipeline_formula"], rel=1e-12), row["recompute"]
            assert row["sent_pipeline"] > 0
            # every pipeline waits (the last stage for its first input at least); above 1 where 4 ranks share 2 cores
            assert row["bubble_fraction"] > 0 and row["phase_pipeline_wait"] > 0, row["recompute"]
            assert row["memory_activations_ratio"] == 1.0 and row["memory_workspace_ratio"] == 1.0, row["recompute"]
            assert row["stage_layers"] == ("2,2" if v == 1 else "1,1,1,1")
            # recomputation on the critical path: on demand, and in windows after the awaited gradient came
            assert row["recompute_exposed"] == pytest.approx(
                row["phase_recompute"] + row["phase_recompute_window"] - row["phase_recompute_hidden"], rel=1e-9, abs=1e-12)
    assert set(two_stages[1]["bubble_fraction_formula"]) == {0.25, 0.125}  # (2 - 1) / (v 4), v = 1 and 2


def test_phases_add_up_to_the_step(two_stages, four_ranks):
    runs = [(path, run) for path in (two_stages[0], four_ranks[0]) for run in sr.run_ids(path)]
    for path, run in runs:
        phases = sr.read_run_table(path, run, "phases")
        samples = sr.read_run_table(path, run, "samples")
        for (case, rank, iteration), step_time in samples.set_index(["case", "rank", "iteration"])["time"].items():
            it = phases[(phases["case"] == case) & (phases["rank"] == rank) & (phases["iteration"] == iteration)]
            it = it.set_index("phase")["time"]
            where = (path, run, case, rank, iteration)
            assert (it >= 0).all(), where
            parts = sum(it[p] for p in ("forward", "backward", "recompute_window", "optimizer", "comm_exposed", "idle"))
            # the sample adds the barrier-to-step gap only; the phases cover the step
            assert parts == pytest.approx(step_time, rel=0.05, abs=2e-3), where
            # the parts of a phase stay inside it: each compute phase without the waits inside it
            assert it["pipeline_wait"] + it["comm_tp"] <= it["comm_exposed"] + 1e-9, where
            assert it["recompute"] <= it["backward"] + 1e-9, where
            assert it["recompute_hidden"] <= it["recompute_window"] + 1e-9, where


def test_recomputation_trains_as_keeping_everything(two_stages, four_ranks):
    interleaved = two_stages[1][two_stages[1]["schedule"] == "interleaved"].set_index("recompute")
    assert interleaved.loc["overlap", "loss_last"] == pytest.approx(interleaved.loc["none", "loss_last"], rel=1e-6)
    for by in (one_f_one_b(two_stages[1]), one_f_one_b(four_ranks[1])):
        for mode in by.index:
            # the recomputed activations are the kept ones bit for bit: the same losses
            assert by.loc[mode, "loss_last"] == pytest.approx(by.loc["none", "loss_last"], rel=1e-6), mode
            assert by.loc[mode, "loss_first"] == pytest.approx(by.loc["none", "loss_first"], rel=1e-6), mode
        assert by.loc["none", "flop_recompute"] == 0 and by.loc["none", "hfu"] == pytest.approx(by.loc["none", "mfu"])
        assert by.loc["full", "flop_recompute"] > 0 and by.loc["full", "hfu"] > by.loc["full", "mfu"]
        assert by.loc["full", "memory_activations"] < by.loc["none", "memory_activations"]
        # overlap recomputes what its placement does not keep: HFU above MFU exactly when that is something
        assert (by.loc["overlap", "hfu"] > by.loc["overlap", "mfu"]) == (by.loc["overlap", "flop_recompute"] > 0)
        assert by.loc["overlap", "placement_search"] >= 0 and not np.isnan(by.loc["overlap", "placement_exposed"])
        assert np.isnan(by.loc["none", "placement_exposed"])
        for mode in ("none", "full"):
            assert by.loc[mode, "phase_recompute_window"] == 0 and by.loc[mode, "recompute_policy"] == ""
    by = one_f_one_b(two_stages[1])
    assert by.loc["selective", "hfu"] > by.loc["selective", "mfu"]


def test_a_stage_s_data_parallel_ranks_recompute_alike(tmp_path):
    """tp 1 x pp 2 x dp 2 under ZeRO-3: the data-parallel ranks of a stage gather sharded parameters inside the
    windows, so they must run one placement (each measures its own windows); with two, the gathers pair up wrongly
    and the losses move (seen about once in six runs at 8 micro-batches before the stage agreed on one)."""
    args = TINY[:TINY.index("--microbatches")] + ["--microbatches", "8", "-q"]
    out = tmp_path / "dp2.h5"
    result = mpirun(4, [program("strata-step"), *args, "--pp", "2", "--zero", "3", "--recompute", "none,overlap",
                        "-w", "1", "-n", "2", "--output", str(out)], cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "CHECK FAILED" not in result.stdout, result.stdout
    by = sr.read_cases_with_summary(str(out), "strata-step").set_index("recompute")
    assert set(by["dp"]) == {2}
    assert by.loc["overlap", "loss_last"] == pytest.approx(by.loc["none", "loss_last"], rel=1e-6)


def test_a_stored_policy_runs_again_to_the_same_losses(two_stages):
    path, table, folder = two_stages
    policy = json.loads(one_f_one_b(table).loc["overlap", "recompute_policy"])
    assert policy["format"] == "strata-recompute-policy" and policy["version"] == 1
    # every op of both stages: 4 micro-batches x 4 layers x 3 ops
    assert len(policy["placement"]) == 4 * 4 * 3
    assert {entry["mode"] for entry in policy["placement"]} <= {"keep", "on-demand", "window"}
    file = folder / "policy.json"
    file.write_text(json.dumps(policy))
    again = step_run(2, ["--pp", "2", "--recompute", "overlap", "--recompute-policy", str(file), "--comm-algo", "ring",
                         "-w", "1", "-n", "2"], folder, folder / "again.h5").iloc[0]
    first = one_f_one_b(table).loc["overlap"]
    assert again["loss_first"] == first["loss_first"] and again["loss_last"] == first["loss_last"]
    assert again["flop_recompute"] == first["flop_recompute"]  # the same ops kept
    assert json.loads(again["recompute_policy"]) == policy


def test_the_timeline_shows_the_pipeline(two_stages):
    path, table, _ = two_stages
    run = sr.run_ids(path)[0]  # 1F1B
    overlap = MODES.index("overlap")
    events = sr.read_run_table(path, run, "events", where={"case": overlap})
    operations = set(events["operation"])
    for rank in (0, 1):
        mine = events[events["rank"] == rank]
        assert sum(op.startswith("forward mb ") for op in mine["operation"]) == 4
        assert sum(op.startswith("backward mb ") for op in mine["operation"]) == 4
    assert {"send activations mb 0 stage 0", "recv activations mb 0 stage 1", "send gradients mb 0 stage 1",
            "recv gradients mb 0 stage 0"} <= operations
    assert set(events.loc[events["operation"].str.startswith(("send ", "recv ")), "group"]) == {"pp"}
    metrics = sr.read_run_table(path, run, "metrics", where={"case": overlap, "metric": "pipeline_rank"})
    assert dict(zip(metrics["rank"], metrics["value"])) == {0: 0, 1: 1}


def report(files, out):
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, "strata-report"), *files, "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=180)


def test_the_report_draws_the_pipeline(two_stages, four_ranks, tmp_path):
    result = report([two_stages[0], four_ranks[0]], tmp_path)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "report.md").read_text()
    assert "### Pipeline: schedules and recomputation modes side by side" in text
    assert "Memory per pipeline stage" in text
    assert "NNN pp2 1f1b overlap" in text and "NNN tp2 pp2 1f1b overlap" in text
    for name in ("step_phases.png", "step_memory.png", "step_bubble.png", "step_stage_memory.png",
                 "step_pipeline_timeline.png", "step_timeline.png"):
        assert (tmp_path / name).stat().st_size > 10_000, name
        assert f"]({name})" in text


def test_a_file_from_before_the_pipeline_columns_still_renders(two_stages, tmp_path):
    """The columns the pipeline added, removed from a copy: the report draws the step section as before, without
    the pipeline's part."""
    old = tmp_path / "old.h5"
    shutil.copy(two_stages[0], old)
    with h5py.File(old, "a") as f:
        for run in f["runs"].values():
            for column in [*PIPELINE_SUMMARY, "phase_comm_tp", "phase_recompute", "flop_recompute"]:
                if column in run["summary"] and column != "mfu":
                    del run["summary"][column]
            for column in [*PIPELINE_CASES, "recompute", "tp", "sp"]:
                if column in run["cases"]:
                    del run["cases"][column]
    result = report([str(old)], tmp_path / "old")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "old" / "report.md").read_text()
    assert "## Training step (strata-step)" in text and "### Pipeline" not in text
    assert (tmp_path / "old" / "step_phases.png").stat().st_size > 10_000
    assert not (tmp_path / "old" / "step_pipeline_timeline.png").exists()
    # and beside a new file: the old cases count as one stage, the new ones draw the pipeline
    result = report([str(old), two_stages[0]], tmp_path / "both")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "both" / "step_pipeline_timeline.png").exists()


@pytest.fixture(scope="module")
def kept_file(two_stages):
    """A results file a bad run must leave byte for byte."""
    return two_stages[0]


def policy_variants(table) -> dict[str, str]:
    policy = json.loads(one_f_one_b(table).loc["overlap", "recompute_policy"])
    other_format = dict(policy, format="other-policy")
    unknown_op = dict(policy, placement=[*policy["placement"], {"op": "mb9.L0.pre", "mode": "keep"}])
    unknown_mode = dict(policy, placement=[dict(policy["placement"][0], mode="later")] + policy["placement"][1:])
    unknown_mode["placement"][0].pop("window", None)
    return {"malformed": "{\"format\": \"strata-recompute-policy\", \"placement\": [",
            "format": json.dumps(other_format), "op": json.dumps(unknown_op), "mode": json.dumps(unknown_mode)}


@pytest.mark.parametrize("args, message", [
    (["--grid", "tp=1,pp=2,dp=2"], "--grid tp=1,pp=2,dp=2 has 4 ranks, the job 2"),
    (["--pp", "4"], "--tp 1 x --pp 4 does not divide the 2 ranks"),
    (["--grid", "tp=2,pp=1", "--hidden", "96", "--heads", "3", "--kv-heads", "3"], "--tp: tensor-parallel degree 2 does not divide"),
    (["--pp", "2", "--layers", "3"], "3 layers do not divide into 2 pipeline stages evenly: give each stage's layers (--stage-layers)"),
    (["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2", "--microbatches", "3"],
     "3 micro-batches are not a multiple"),
    (["--pp", "2", "--stage-layers", "1,2"], "--stage-layers adds up to 3 layers, the model has 4"),
    (["--pp", "2", "--stage-layers", "1,3", "--partition", "balanced"], "--stage-layers and --partition balanced both given"),
    (["--pp", "2", "--recompute", "overlap", "--recompute-policy", "{malformed}"], "not JSON"),
    (["--pp", "2", "--recompute", "overlap", "--recompute-policy", "{format}"], "\"format\" must be \"strata-recompute-policy\""),
    (["--pp", "2", "--recompute", "overlap", "--recompute-policy", "{op}"], "1 entry names no op of this run: unknown op 'mb9.L0.pre'"),
    (["--pp", "2", "--recompute", "overlap", "--recompute-policy", "{mode}"], "has mode 'later'"),
    (["--pp", "2", "--partition", "balanced", "--recompute", "overlap", "--recompute-policy", "{format}"],
     "\"format\" must be \"strata-recompute-policy\""),
    (["--pp", "2", "--recompute", "full", "--recompute-policy", "{format}"], "give --recompute overlap"),
])
def test_bad_input_exits_2_and_leaves_the_file(two_stages, kept_file, tmp_path, args, message):
    out = tmp_path / "keep.h5"
    shutil.copy(kept_file, out)
    before = digest(str(out))
    files = {}
    for name, text in policy_variants(two_stages[1]).items():
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(text)
    args = [str(files[a[1:-1]]) if a.startswith("{") and a.endswith("}") else a for a in args]
    result = mpirun(2, [program("strata-step"), *TINY, "-w", "0", "-n", "1", *args, "--output", str(out)], cwd=str(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr, result.stderr
    assert digest(str(out)) == before
