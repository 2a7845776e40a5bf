"""strata-project predict and validate on real programs: a prediction on a shipped spec-sheet description (a small
model, and GPT-3 175B on 10,240 GPUs, timed), validation of strata-step cases measured here (data-parallel
strategies, a pipeline with recomputation, overlapped recomputation, tensor parallelism) against a description
calibrated from benchmark runs of this test, and bad input: each a message and exit 2 with the output untouched."""
from __future__ import annotations

import json
import math
import os
import time

import h5py
import pytest

from conftest import ROOT, digest, mpirun, program, run_single

SYSTEMS = os.path.join(ROOT, "project", "systems")
H100 = os.path.join(SYSTEMS, "h100-sxm-ndr400.json")
QUICK = ["-n", "3", "-w", "1", "-q"]
COMPONENTS = ["forward", "backward", "optimizer", "comm_exposed", "idle", "recompute", "comm_tp", "pipeline_wait",
              "recompute_window"]


def project(args, cwd, timeout=120):
    return run_single([program("strata-project"), *args], cwd=str(cwd), timeout=timeout)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A description calibrated from tiny benchmark runs, and a file of strata-step runs at 2 ranks."""
    folder = tmp_path_factory.mktemp("predict")
    bench, steps = str(folder / "bench.h5"), str(folder / "steps.h5")
    benchmarks = [
        ["strata-gemm", "--square", "32:128", "-d", "fp32"],
        ["strata-attention", "-s", "32,64", "-H", "2", "-D", "16", "-p", "fwd,bwd", "--impl", "flash"],
        ["strata-collective", "--collective", "allreduce,reduce_scatter,allgather,sendrecv", "-b", "8", "-e", "64K",
         "-f", "4", "-a", "ring,library", "--placement", "out"],
        ["strata-collective", "--collective", "allreduce,reduce_scatter,allgather,sendrecv", "-b", "8", "-e", "64K",
         "-f", "4", "-a", "ring", "--placement", "out", "--ranks-per-node", "1"],
        ["strata-interference", "--gemm", "64x64x64", "-s", "64", "-H", "2", "-D", "16", "-b", "64K", "-e", "256K",
         "--calls", "2"],
        ["strata-elementwise", "--preset", "tiny", "--tokens", "64"],
        ["strata-elementwise", "--preset", "tiny", "--tokens", "64", "--tp", "2"],
    ]
    for name, *args in benchmarks:
        result = mpirun(2, [program(name), *args, *QUICK, "--output", bench], cwd=str(folder))
        assert result.returncode == 0, (name, result.stderr[-2000:])
    tiny = ["--model", "tiny", "--seq", "32", "--micro-batch", "2", "--comm-algo", "ring"]
    step_runs = [
        [*tiny, "--accumulation", "2", "--zero", "0,3", "--group-size", "1"],
        [*tiny, "--accumulation", "4", "--pp", "2", "--recompute", "none,full,overlap"],
        [*tiny, "--accumulation", "2", "--tp", "2", "--recompute", "selective"],
    ]
    for args in step_runs:
        result = mpirun(2, [program("strata-step"), *args, *QUICK, "--output", steps], cwd=str(folder))
        assert result.returncode == 0, (args, result.stderr[-2000:])
    system = folder / "system.json"
    result = project(["calibrate", bench, "-o", str(system), "-q"], folder)
    assert result.returncode == 0, result.stderr
    return folder, bench, steps, str(system)


def read_table(path, table):
    with h5py.File(path, "r") as f:
        runs = [g for g in f["runs"].values() if table in g]
        assert len(runs) == 1
        group = runs[0][table]
        rows = int(group.attrs["rows"])
        columns = {}
        for name, data in group.items():
            values = data[:rows]
            if h5py.check_string_dtype(data.dtype) is not None:
                values = data.asstr()[:rows]
            columns[name] = list(values)
        units = {name: data.attrs["units"] for name, data in group.items()}
        return dict(runs[0].attrs), columns, units


def test_predict_a_small_model_on_a_spec_sheet(tmp_path):
    out, trace = tmp_path / "p.h5", tmp_path / "t.json"
    result = project(["predict", "--system", H100, "--model", "gpt2-124m", "--seq", "1024", "--micro-batch", "4",
                      "--accumulation", "4", "--zero", "0,3", "--nodes", "2", "--timeline", str(trace), "-O", str(out)],
                     tmp_path)
    assert result.returncode == 0, result.stderr
    assert "on 16 rank(s)" in result.stdout and "bf16 GEMMs" in result.stdout
    assert "# NNN: step " in result.stdout and "# GGG: step " in result.stdout
    assert "MFU" in result.stdout and "memory/rank" in result.stdout and "exposed comm" in result.stdout
    run, rows, units = read_table(str(out), "prediction")
    assert run["benchmark"] == "strata-project" and run["command"] == "predict"
    assert run["status"] == "ok"
    assert rows["label"] == ["NNN", "GGG"] and rows["ranks"] == [16, 16] and rows["dtype"] == ["bf16", "bf16"]
    assert units["step_time"] == "s" and units["memory_optimizer"] == "B" and units["mfu"] == "1"
    for i in range(2):
        assert 0 < rows["step_time_low"][i] <= rows["step_time"][i] <= rows["step_time_high"][i]
        assert 0 < rows["mfu"][i] < 1 and rows["tokens_per_s"][i] > 0
        parts = sum(rows[f"phase_{c}"][i] for c in ("forward", "backward", "optimizer", "comm_exposed", "idle"))
        assert parts <= rows["step_time"][i] * (1 + 1e-9)
    # Mixed precision: 2, 2 and 12 bytes per parameter, the optimizer's sharded 16 ways by ZeRO-3.
    n = rows["parameters"][0]
    assert rows["memory_parameters"][0] == pytest.approx(2 * n, rel=0.01)
    assert rows["memory_optimizer"][0] == pytest.approx(12 * n, rel=0.01)
    assert rows["memory_optimizer"][0] == pytest.approx(16 * rows["memory_optimizer"][1], rel=0.01)
    # MFU: 6N + 6Lhs per token over the bf16 peak; tokens of the global batch (16 ranks x 4 x 4 rows of 1024).
    tokens = 16 * 4 * 4 * 1024
    for i in range(2):
        flop = (6 * n + 6 * 12 * 768 * 1024) * tokens / 16
        assert rows["flop"][i] == pytest.approx(flop, rel=1e-9)
        assert rows["peak_per_rank"][i] == 989e12
        assert rows["mfu"][i] == pytest.approx(flop / (rows["step_time"][i] * 989e12), rel=1e-9)
        assert rows["tokens_per_s"][i] == pytest.approx(tokens / rows["step_time"][i], rel=1e-9)
    for i in range(2):
        chrome = json.loads((tmp_path / f"t-{i}.json").read_text())
        names = {e["args"]["name"] for e in chrome["traceEvents"] if e.get("name") == "thread_name"}
        assert "compute" in names and any(n.startswith("dp ") for n in names)
        assert any(e.get("name") == "qkv" for e in chrome["traceEvents"])


def predict_each(tmp_path, common: list[str], flag: str, values) -> dict:
    """One prediction per value of a flag: its header and its prediction table's row (values, units)."""
    made = {}
    for value in values:
        out = tmp_path / f"{flag.strip('-')}-{value}.h5"
        result = project([*common, flag, value, "-O", str(out)], tmp_path)
        assert result.returncode == 0, result.stderr
        _, rows, units = read_table(str(out), "prediction")
        made[value] = (result.stdout, rows, units)
    return made


def test_gradients_reduced_in_fp32_are_stated_recorded_and_cost(tmp_path):
    # ZeRO-3 on two nodes, one micro-batch: the gradients' reduce-scatters in fp32 (--grad-reduce-dtype, as FSDP's
    # reduce_dtype float32) take longer than in bf16 and are not all hidden; auto is the step's element size.
    common = ["predict", "--system", H100, "--model", "gpt2-124m", "--seq", "1024", "--micro-batch", "1",
              "--accumulation", "1", "--zero", "3", "--nodes", "2"]
    made = predict_each(tmp_path, common, "--grad-reduce-dtype", ("auto", "bf16", "fp32"))
    for dtype, (header, rows, units) in made.items():
        assert ("gradients reduced in fp32" in header) == (dtype == "fp32")
        assert rows["gradient_reduction_bytes"] == [{"auto": 0, "bf16": 2, "fp32": 4}[dtype]]
        assert units["gradient_reduction_bytes"] == "B"
    steps = {dtype: rows["step_time"][0] for dtype, (_, rows, _) in made.items()}
    assert steps["bf16"] == pytest.approx(steps["auto"], rel=1e-12)
    assert steps["fp32"] > steps["bf16"]


def test_predict_gpt3_175b_on_10240_gpus(tmp_path):
    out = tmp_path / "big.h5"
    start = time.monotonic()
    result = project(["predict", "--system", H100, "--model", "gpt3-175b", "--seq", "2048", "--micro-batch", "1",
                      "--accumulation", "16", "--tp", "8", "--pp", "16", "--schedule", "interleaved", "--virtual-stages",
                      "2", "--sp", "--zero", "1", "--recompute", "selective", "--gpus", "10240", "-O", str(out)],
                     tmp_path, timeout=300)
    seconds = time.monotonic() - start
    print(f"\n[ predict  ] GPT-3 175B on 10,240 GPUs (tp 8, pp 16, dp 80, interleaved): {seconds:.2f} s")
    assert result.returncode == 0, result.stderr
    assert "tp 8 x pp 16 x dp 80" in result.stdout and "pipeline wait (bubble)" in result.stdout
    _, rows, _ = read_table(str(out), "prediction")
    assert rows["ranks"] == [10240] and rows["phase_pipeline_wait"][0] > 0 and rows["phase_comm_tp"][0] > 0


def test_validate_measured_steps(measured, tmp_path):
    folder, _, steps, system = measured
    out = tmp_path / "v.h5"
    result = project(["validate", steps, "--system", system, "-O", str(out)], folder)
    assert result.returncode == 0, result.stderr
    assert "mean absolute" in result.stdout and "| case | ranks |" in result.stdout
    run, rows, units = read_table(str(out), "validation")
    assert run["command"] == "validate"
    # The step's elementwise kernels were measured beside its GEMMs: the description times them by kernel.
    with open(system) as handle:
        elementwise = json.load(handle)["device"]["elementwise"]
    assert {"layernorm_forward", "gelu_backward", "permute_qkv", "adamw"} <= set(elementwise["kernels"])
    assert elementwise["bandwidth"]["value"] > 0
    labels = rows["label"]
    assert labels == ["NNN", "GGG", "NNN", "NNN recompute full", "NNN recompute overlap", "NNN recompute selective"]
    assert rows["pp"] == [1, 1, 2, 2, 2, 1] and rows["tp"] == [1, 1, 1, 1, 1, 2]
    assert units["step_time_error"] == "1" and units["phase_forward_measured"] == "s"
    for i in range(len(labels)):
        assert rows["step_time_measured"][i] > 0 and rows["step_time_predicted"][i] > 0
        assert math.isfinite(rows["step_time_error"][i])
        assert rows["step_time_error"][i] == pytest.approx(rows["step_time_predicted"][i] / rows["step_time_measured"][i] - 1)
        for c in COMPONENTS:
            assert math.isfinite(rows[f"phase_{c}_error"][i])
    # The pipeline's cases wait for the other stage, the tensor-parallel one for its collectives; recomputation shows.
    assert all(rows["phase_pipeline_wait_predicted"][i] > 0 for i in (2, 3, 4))
    assert rows["phase_comm_tp_predicted"][5] > 0 and rows["phase_recompute_predicted"][3] > 0
    _, predicted, _ = read_table(str(out), "prediction")
    assert predicted["label"] == labels and predicted["dtype"] == ["fp32"] * len(labels)
    # The traced job's nodes are the run's: one rank per emulated node under --group-size 1, else the real node.
    assert predicted["ranks_per_node"] == [1, 1, 2, 2, 2, 2]
    # The report draws the project runs.
    report = run_single([os.path.join(ROOT, "scripts", "strata-report"), str(out), "--out", str(tmp_path / "r"), "--quiet"],
                        cwd=str(tmp_path))
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "r" / "report.md").read_text()
    assert "## Predictions (strata-project)" in text and "### Validation" in text
    assert (tmp_path / "r" / "validation_phases.png").exists() and (tmp_path / "r" / "prediction_phases.png").exists()


def test_runs_of_the_same_command_are_one_case_held_to_their_median(measured, tmp_path):
    """make run's passes: the same strata-step command three times into one file is one validated case at the median
    of the three runs' steps, whatever they printed (-q, --progress-interval); the same command with other flags (here
    --iters) is a case of its own."""
    folder, _, _, system = measured
    steps = str(tmp_path / "repeated.h5")
    tiny = ["--model", "tiny", "--seq", "32", "--micro-batch", "2", "--accumulation", "2", "--zero", "0", "--group-size", "1"]
    for iters, display in (("3", ["-q"]), ("3", ["--progress-interval", "0"]), ("3", ["-q"]), ("4", ["-q"])):
        result = mpirun(2, [program("strata-step"), *tiny, "-n", iters, "-w", "1", *display, "--output", steps],
                        cwd=str(tmp_path))
        assert result.returncode == 0, result.stderr[-2000:]
    measured_steps = []
    with h5py.File(steps, "r") as f:
        for g in f["runs"].values():
            if json.loads(g.attrs["config_json"])["iters"] == 3:
                measured_steps.append(float(g["summary"]["time_rankmax_median"][0]))
    out = tmp_path / "v.h5"
    result = project(["validate", steps, "--system", system, "-O", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr
    _, rows, _ = read_table(str(out), "validation")
    assert rows["step_runs"] == [3, 1]
    assert rows["step_time_measured"][0] == pytest.approx(sorted(measured_steps)[1], rel=1e-12)
    assert "| runs |" in result.stdout


def untouched(tmp_path, name="kept.h5"):
    """A results file holding an earlier run, and its digest: a refused command must leave it byte for byte."""
    out = tmp_path / name
    result = project(["predict", "--system", H100, "--model", "tiny", "--seq", "32", "-q", "-O", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr
    return out, digest(str(out))


def write_system(tmp_path, edit, base=H100):
    with open(base) as f:
        system = json.load(f)
    edit(system)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(system))
    return str(path)


def test_attention_runs_on_the_kernel_the_description_names(tmp_path):
    # GPT-2 at 2048 tokens on one H100: llm-foundry's Triton FlashAttention (the shipped descriptions'
    # flash-triton: the described kernel's speed x 0.71 forward, x 0.5 backward) costs more than the described
    # flash kernel and less than materialised scores; each run says and records which it predicted.
    common = ["predict", "--system", H100, "--model", "gpt2-124m", "--seq", "2048", "--positions", "2048",
              "--micro-batch", "4", "--accumulation", "1", "--gpus", "1"]
    made = predict_each(tmp_path, common, "--attention", ("flash", "flash-triton", "unfused"))
    for attention, (header, rows, _) in made.items():
        assert f"bf16 GEMMs and attention ({attention})" in header, header
        assert rows["attention"] == [attention]
    steps = {attention: rows["step_time"][0] for attention, (_, rows, _) in made.items()}
    assert steps["flash"] < steps["flash-triton"] < steps["unfused"]


def test_an_fp32_loss_is_stated_recorded_and_costs_its_passes(tmp_path):
    # GPT-2 with tp 2 on one H100 node: Megatron's cross entropy on fp32 logits, pass by pass (--loss fp32), costs
    # more than Megatron-Core's fused version of it (fp32-fused), which costs more than the step's own fused kernels;
    # both keep the logits in fp32 where the fused loss keeps them at 2 bytes; the header says so and the column
    # records it.
    common = ["predict", "--system", H100, "--model", "gpt2-124m", "--seq", "1024", "--micro-batch", "4",
              "--accumulation", "1", "--tp", "2", "--gpus", "2"]
    made = predict_each(tmp_path, common, "--loss", ("fused", "fp32-fused", "fp32"))
    for loss, (header, rows, _) in made.items():
        assert ("the loss in fp32 pass by pass" in header) == (loss == "fp32"), header
        assert ("the loss in fp32 in three fused passes" in header) == (loss == "fp32-fused"), header
        assert rows["loss"] == [loss]
    steps = {loss: rows["step_time"][0] for loss, (_, rows, _) in made.items()}
    assert steps["fused"] < steps["fp32-fused"] < steps["fp32"]
    # The output layer's logits of the rank's half of GPT-2's vocabulary (25,129 of 50,257 rows), 4 against 2 bytes.
    logits = 4 * 1024 * 25129
    kept = {loss: rows["memory_activations"][0] for loss, (_, rows, _) in made.items()}
    assert kept["fp32"] - kept["fused"] == pytest.approx(2 * logits, rel=1e-9)
    assert kept["fp32-fused"] == kept["fp32"]  # the same fp32 softmax saved for the backward


def test_dropout_off_holds_no_masks_and_costs_the_same(tmp_path):
    # GPT-2 on one H100 without dropout (MPT's and Llama's models train without): the layers' and the embeddings'
    # 1-byte masks go from the predicted activations, the step stays; the header and the column say which.
    common = ["predict", "--system", H100, "--model", "gpt2-124m", "--seq", "1024", "--micro-batch", "4",
              "--accumulation", "1", "--gpus", "1"]
    made = predict_each(tmp_path, common, "--dropout", ("on", "off"))
    for dropout, (header, rows, _) in made.items():
        assert ("no dropout" in header) == (dropout == "off"), header
        assert rows["dropout"] == [int(dropout == "on")]
    on, off = made["on"][1], made["off"][1]
    # Two masks per layer and the embeddings' one, sbh bytes each.
    assert on["memory_activations"][0] - off["memory_activations"][0] == pytest.approx((2 * 12 + 1) * 4 * 1024 * 768,
                                                                                       rel=1e-9)
    assert off["step_time"][0] == pytest.approx(on["step_time"][0], rel=1e-12)


def test_sharding_buffers_are_a_frameworks_and_are_stated_and_recorded(tmp_path):
    # GPT 530B under ZeRO-3 on 640 A100s at micro-batch 4, as Narayanan et al. 2021 ran it with DeepSpeed (Table 2): the
    # step's own pools hold eight whole layers (5 billion parameters each) and do not fit the card; DeepSpeed's defaults
    # hold its largest module (the MLP's 4h x h weight) and its buckets, FSDP two layers each way and its root unit.
    a100 = os.path.join(SYSTEMS, "a100-80gb-sxm-hdr200.json")
    common = ["predict", "--system", a100, "--layers", "105", "--hidden", "20480", "--heads", "128", "--vocab", "51200",
              "--seq", "2048", "--micro-batch", "4", "--accumulation", "1", "--gpus", "640", "--zero", "3",
              "--recompute", "full", "--dtype", "fp16", "--attention", "unfused", "--loss", "fp32"]
    made = predict_each(tmp_path, common, "--sharding-buffers", ("strata", "fsdp", "deepspeed"))
    for buffers, (header, rows, _) in made.items():
        assert ("sharded states' buffers as " + buffers in header) == (buffers != "strata"), header
        assert rows["sharding_buffers"] == [buffers]
    comm = {buffers: rows["memory_comm_buffers"][0] for buffers, (_, rows, _) in made.items()}
    mlp = 4 * 20480 ** 2
    assert comm["deepspeed"] == pytest.approx(2 * (mlp + 5e7) + 2 * (5e8 + mlp), rel=1e-9)
    h = 20480
    layer, root = 12 * h * h + 13 * h, (51200 + 2048) * h + 2 * h  # weights and biases; tokens, positions, final norm
    assert layer % 640 == 0 and root % 640 == 0  # no padding
    assert comm["fsdp"] == pytest.approx(2 * (root + 2 * layer) + 2 * (2 * layer), rel=1e-12)
    assert comm["strata"] == pytest.approx(2 * (4 * layer) + 2 * (4 * layer), rel=1e-12)
    assert made["strata"][1]["fits"] == [0]
    def total(rows):
        return sum(rows["memory_" + c][0] for c in ("parameters", "gradients", "optimizer", "activations", "workspace",
                                                     "comm_buffers"))
    assert total(made["deepspeed"][1]) < 0.6 * total(made["strata"][1])
    steps = {rows["step_time"][0] for _, rows, _ in made.values()}
    assert max(steps) == pytest.approx(min(steps), rel=1e-12)


def test_bad_systems_exit_2(tmp_path):
    out, before = untouched(tmp_path)
    small = ["--model", "tiny", "--seq", "32", "-O", str(out)]
    missing = write_system(tmp_path, lambda s: s["device"].pop("memory_bandwidth"))
    result = project(["predict", "--system", missing, *small], tmp_path)
    assert result.returncode == 2 and "memory_bandwidth" in result.stderr, result.stderr
    negative = write_system(tmp_path, lambda s: s["network"]["inter_node"]["bandwidth"].update(value=-1))
    result = project(["predict", "--system", negative, *small], tmp_path)
    assert result.returncode == 2 and "network.inter_node.bandwidth must be positive" in result.stderr, result.stderr
    result = project(["predict", *small], tmp_path)
    assert result.returncode == 2 and "--system FILE is required" in result.stderr
    assert digest(str(out)) == before


@pytest.mark.parametrize("args, message", [
    (["--model", "tiny", "--seq", "32", "--tp", "3", "--gpus", "8"], "does not divide the 8 ranks"),
    (["--model", "tiny", "--seq", "32", "--tp", "8", "--gpus", "8"], "--tp: tensor-parallel degree 8 does not divide"),
    (["--model", "tiny", "--seq", "32", "--pp", "2", "--stage-layers", "1,2", "--gpus", "8"], "layers"),
    (["--model", "tiny", "--seq", "32", "--gpus", "8", "--nodes", "2"], "--gpus 8 and --nodes 2 disagree"),
    (["--model", "tiny", "--seq", "32", "--pp", "2", "--recompute", "overlap"], "--recompute overlap needs a placement"),
    (["--model", "tiny", "--seq", "32", "--dtype", "fp8x"], "--dtype fp8x: the system's device has no such compute"),
    (["--model", "tiny", "--seq", "32", "--sharding-collectives", "zero3-2021"],
     "--sharding-collectives zero3-2021: the system description"),
    (["--model", "tiny", "--seq", "32", "--attention", "sparse"],
     "--attention sparse: the system description '8x H100 SXM5"),
])
def test_a_configuration_that_does_not_divide_exits_2(tmp_path, args, message):
    out, before = untouched(tmp_path)
    result = project(["predict", "--system", H100, *args, "-O", str(out)], tmp_path)
    assert result.returncode == 2, result.stdout
    assert message in result.stderr, result.stderr
    assert digest(str(out)) == before


def test_validate_refuses_files_without_steps_and_systems_fitted_from_steps(measured, tmp_path):
    folder, bench, steps, system = measured
    out, before = untouched(tmp_path)
    result = project(["validate", bench, "--system", system, "-O", str(out)], folder)
    assert result.returncode == 2
    assert "holds no strata-step case" in result.stderr and bench in result.stderr
    fitted = write_system(tmp_path, lambda s: s.update(comment="Calibrated from 3 strata-step run(s) of steps.h5"),
                          base=system)
    result = project(["validate", steps, "--system", fitted, "-O", str(out)], folder)
    assert result.returncode == 2 and "fitted from strata-step runs" in result.stderr, result.stderr
    notes = tmp_path / "notes.txt"
    notes.write_text("not results\n")
    result = project(["validate", str(notes), "--system", system, "-O", str(out)], folder)
    assert result.returncode == 2 and "is not an HDF5 file" in result.stderr
    result = project(["validate", steps, "--system", system, "-O", str(folder)], folder)
    assert result.returncode == 2
    assert digest(str(out)) == before


def test_predict_takes_a_stored_placement_and_agrees_with_validate(measured, tmp_path):
    """The placement strata-step stored with its overlap case, given to predict with the same configuration, predicts
    what validate predicted for that case."""
    folder, _, steps, system = measured
    with h5py.File(steps, "r") as f:
        for group in f["runs"].values():
            cases = group["cases"]
            modes = list(cases["recompute"].asstr()[: int(cases.attrs["rows"])])
            if "overlap" in modes:
                policy = cases["recompute_policy"].asstr()[modes.index("overlap")]
    (tmp_path / "policy.json").write_text(policy)
    out, v = tmp_path / "p.h5", tmp_path / "v.h5"
    args = ["--model", "tiny", "--seq", "32", "--micro-batch", "2", "--comm-algo", "ring", "--accumulation", "4",
            "--pp", "2", "--gpus", "2", "--dtype", "fp32"]
    result = project(["predict", "--system", system, *args, "--recompute", "overlap", "--recompute-policy",
                      str(tmp_path / "policy.json"), "-O", str(out), "-q"], folder)
    assert result.returncode == 0, result.stderr
    assert project(["validate", steps, "--system", system, "-O", str(v), "-q"], folder).returncode == 0
    _, predicted, _ = read_table(str(out), "prediction")
    _, validated, _ = read_table(str(v), "validation")
    at = validated["label"].index("NNN recompute overlap")
    assert predicted["step_time"][0] == pytest.approx(validated["step_time_predicted"][at], rel=1e-12)
    # An entry naming no op of any pipeline rank is refused, naming the count.
    stray = json.loads(policy)
    stray["placement"].append({"op": "L99.mlp_up", "mode": "keep"})
    (tmp_path / "stray.json").write_text(json.dumps(stray))
    result = project(["predict", "--system", system, *args, "--recompute", "overlap", "--recompute-policy",
                      str(tmp_path / "stray.json"), "-q"], folder)
    assert result.returncode == 2 and "1 entries name no op of this configuration" in result.stderr, result.stderr
    # Without the placement the mode is refused; "all" leaves it out.
    all_modes = tmp_path / "all.h5"
    result = project(["predict", "--system", system, *args, "--recompute", "all", "-O", str(all_modes), "-q"], folder)
    assert result.returncode == 0, result.stderr
    _, rows, _ = read_table(str(all_modes), "prediction")
    assert rows["recompute"] == ["none", "full", "selective"]
