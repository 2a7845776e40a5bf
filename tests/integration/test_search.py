"""strata-project search on the shipped spec-sheet systems: a small model and GPT-3 175B on 1024 GPUs, the top k
printed and stored as a run's `search` table that strata-report shows; PaRO's rule beside the search
(--compare-paro, table `paro_rule`); and bad input (devices that do not fit the grid asked for, a system description
missing a field, no device memory to limit by, nothing that fits), each one message and exit 2 with the output file
left as it was."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, SCRIPTS, digest, program, run_single

import strata_results as sr

A100 = os.path.join(ROOT, "project", "systems", "a100-80gb-sxm-hdr200.json")
H100 = os.path.join(ROOT, "project", "systems", "h100-sxm-ndr400.json")


def search(args, cwd, timeout=600):
    return run_single([program("strata-project"), "search", *args], cwd=str(cwd), timeout=timeout)


def top_rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if re.match(r"^\s+\d+\s+tp\d+ pp\d+ dp\d+ ", line)]


def test_small_model_top_k_printed_stored_and_reported(tmp_path):
    out = tmp_path / "search.h5"
    result = search(["--system", A100, "--model", "gpt2-350m", "--gpus", "32", "--global-batch", "64", "--seq", "1024",
                     "-k", "5", "-O", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr
    rows = top_rows(result.stdout)
    assert len(rows) == 5, result.stdout
    assert "# configurations:" in result.stdout and "# rate:" in result.stdout
    assert re.search(r"refused \(divisibility\): \d+", result.stdout)
    runs = sr.read_runs([str(out)])
    assert list(runs["benchmark"]) == ["strata-project search"] and list(runs["status"]) == ["ok"]
    assert json.loads(runs["config_json"][0])["gpus"] == 32
    table = sr.read_table([str(out)], "search")
    assert list(table["rank"]) == [1, 2, 3, 4, 5]
    assert list(table["step"]) == sorted(table["step"])
    assert (table["tp"] * table["pp"] * table["dp"] == 32).all()
    assert (table["dp"] * table["micro_batch"] * table["micro_batches"] == 64).all()
    assert (table["memory_total"] <= 80e9).all() and (table["memory_limit"] == 80e9).all()
    parts = (table["compute"] + table["idle"] + table[[c for c in table.columns if c.startswith("exposed_")]].sum(axis=1))
    assert ((parts - table["step"]).abs() <= 1e-6 * table["step"]).all()  # the breakdown adds up to the step
    assert ((table["mfu"] > 0) & (table["mfu"] < 1)).all()
    assert table["label"][0] in rows[0]
    units = table.attrs["units"]
    assert units["step"] == "s" and units["memory_total"] == "B"
    # strata-report shows the top configurations.
    report = subprocess.run([sys.executable, os.path.join(SCRIPTS, "strata-report"), str(out), "--out",
                             str(tmp_path / "report"), "--quiet"], capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Search: gpt2-350m on 32 devices" in text and table["label"][0] in text


def test_gradient_reductions_in_fp32_are_stated_and_recorded(tmp_path):
    tables = {}
    for dtype in ("auto", "fp32"):
        out = tmp_path / f"{dtype}.h5"
        result = search(["--system", A100, "--model", "gpt2-350m", "--gpus", "32", "--global-batch", "64", "--seq",
                         "1024", "-k", "3", "--grad-reduce-dtype", dtype, "-O", str(out)], tmp_path)
        assert result.returncode == 0, result.stderr
        assert ("gradients reduced in 4-byte elements" in result.stdout) == (dtype == "fp32"), result.stdout
        tables[dtype] = sr.read_table([str(out)], "search")
    assert list(tables["auto"]["gradient_reduction_bytes"]) == [0, 0, 0]
    assert list(tables["fp32"]["gradient_reduction_bytes"]) == [4, 4, 4]
    assert tables["fp32"]["step"].iloc[0] >= tables["auto"]["step"].iloc[0]


def test_sharding_buffers_as_predicts(tmp_path):
    """--sharding-buffers as predict's: ZeRO-3 held as FSDP holds it (two layers beside its root unit, two units being
    reduced) needs less than the step's own buffers (four units each way) in every configuration, each configuration
    the same; stated in the header and recorded per row."""
    common = ["--system", A100, "--model", "gpt2-350m", "--gpus", "8", "--global-batch", "16", "--seq", "1024",
              "--strategies", "zero3", "--tp", "1", "--pp", "1", "-k", "3"]
    tables = {}
    for buffers in ("strata", "fsdp"):
        out = tmp_path / f"{buffers}.h5"
        result = search([*common, "--sharding-buffers", buffers, "-O", str(out)], tmp_path)
        assert result.returncode == 0, result.stderr
        assert f"sharding buffers {buffers}," in result.stdout, result.stdout
        tables[buffers] = sr.read_table([str(out)], "search")
        assert list(tables[buffers]["sharding_buffers"]) == [buffers] * 3
    own, fsdp = tables["strata"]["memory_comm_buffers"], tables["fsdp"]["memory_comm_buffers"]
    assert (own > 0).all() and (fsdp < own).all()
    assert fsdp.nunique() == 1


def test_attention_kernel_loss_and_dropout_as_predicts(tmp_path):
    """--attention, --loss and --dropout as predict's: stated in the header, recorded per row; llm-foundry's Triton
    kernel and Megatron's fp32 loss make the best step slower; each stored step is predict's for its configuration."""
    common = ["--system", A100, "--model", "gpt2-350m", "--gpus", "32", "--global-batch", "64", "--seq", "1024",
              "-k", "3"]
    plain = search([*common, "-O", str(tmp_path / "plain.h5")], tmp_path)
    framework = search([*common, "--attention", "flash-triton", "--loss", "fp32", "--dropout", "off",
                        "-O", str(tmp_path / "framework.h5")], tmp_path)
    assert plain.returncode == 0 and framework.returncode == 0, plain.stderr + framework.stderr
    assert "attention flash, loss fused, dropout on" in plain.stdout
    assert "attention flash-triton, loss fp32, dropout off" in framework.stdout
    before = sr.read_table([str(tmp_path / "plain.h5")], "search")
    after = sr.read_table([str(tmp_path / "framework.h5")], "search")
    assert list(before["attention"]) == ["flash"] * 3 and list(before["loss"]) == ["fused"] * 3
    assert list(before["dropout"]) == [1] * 3
    assert list(after["attention"]) == ["flash-triton"] * 3 and list(after["loss"]) == ["fp32"] * 3
    assert list(after["dropout"]) == [0] * 3
    assert after["step"].min() > before["step"].min()
    assert (after["step"] >= after["lower_bound"]).all()
    best = after.iloc[0]
    flags = ["--system", A100, "--model", "gpt2-350m", "--seq", "1024", "--grid",
             f"tp={best['tp']},pp={best['pp']},dp={best['dp']}", "--micro-batch", str(best["micro_batch"]),
             "--accumulation", str(best["micro_batches"]), "--paro", best["strategy"],
             "--recompute", best["recompute"], "--schedule", best["schedule"],
             "--attention", "flash-triton", "--loss", "fp32", "--dropout", "off", "-q", "-O", str(tmp_path / "p.h5")]
    if best["sequence_parallel"]:
        flags.append("--sp")
    if best["virtual_stages"] > 1:
        flags += ["--virtual-stages", str(best["virtual_stages"])]
    predicted = run_single([program("strata-project"), "predict", *flags], cwd=str(tmp_path), timeout=600)
    assert predicted.returncode == 0, predicted.stderr
    step = sr.read_table([str(tmp_path / "p.h5")], "prediction")["step_time"][0]
    assert step == pytest.approx(best["step"], rel=1e-9)


def test_a_custom_model_by_its_dimensions(tmp_path):
    """The dimensions with strata-step's flag names: gpt2-350m's give the preset's ranking; a wider MLP a slower step."""
    common = ["--system", A100, "--gpus", "32", "--global-batch", "64", "--seq", "1024", "-k", "3"]
    dims = ["--layers", "24", "--hidden", "1024", "--heads", "16", "--vocab", "50257"]
    preset = search([*common, "--model", "gpt2-350m", "-O", str(tmp_path / "preset.h5")], tmp_path)
    same = search([*common, *dims, "--mlp-hidden", "4096", "-O", str(tmp_path / "same.h5")], tmp_path)
    wider = search([*common, *dims, "--mlp-hidden", "8192", "-O", str(tmp_path / "wider.h5")], tmp_path)
    for result in (preset, same, wider):
        assert result.returncode == 0, result.stderr
    step = {name: sr.read_table([str(tmp_path / f"{name}.h5")], "search")
            for name in ("preset", "same", "wider")}
    assert list(step["same"]["label"]) == list(step["preset"]["label"])
    assert list(step["same"]["step"]) == pytest.approx(list(step["preset"]["step"]), rel=1e-12)
    assert step["wider"]["step"].min() > 1.2 * step["preset"]["step"].min()


def test_gpt3_175b_on_1024_gpus(tmp_path):
    out = tmp_path / "search.h5"
    result = search(["--system", H100, "--model", "gpt3-175b", "--gpus", "1024", "--global-batch", "1536", "--seq", "2048",
                     "-k", "3", "-O", str(out)], tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(top_rows(result.stdout)) == 3, result.stdout
    rate = re.search(r"# rate: (\d+) runnable configurations/s", result.stdout)
    assert rate and int(rate.group(1)) > 0
    table = sr.read_table([str(out)], "search")
    assert len(table) == 3
    assert (table["tp"] * table["pp"] * table["dp"] == 1024).all()
    assert (table["memory_total"] <= 80e9).all()
    # 175B does not train on data parallelism alone within 80 GB: the best split the model.
    assert (table["tp"] * table["pp"] > 1).all()
    assert (table["step"] >= table["lower_bound"]).all()


def test_compare_paro_prints_and_stores_the_scenarios(tmp_path):
    out = tmp_path / "paro.h5"
    result = search(["--system", A100, "--compare-paro", "--paro-models", "gpt3-1.3b", "--paro-nodes", "2",
                     "--paro-micro-batches", "1,16", "--paro-ratios", "system,16", "--seq", "1024", "-O", str(out)],
                    tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.search(r"# agreement: the same strategy in \d+ of 8 scenarios", result.stdout), result.stdout
    table = sr.read_table([str(out)], "paro_rule")
    assert len(table) == 8  # 1 model x 2 trainable x 1 node count x 2 micro-batch counts x 2 ratios
    assert set(table["trainable"]) == {"all", "0.0625"}
    with open(A100) as f:
        network = json.load(f)["network"]
    system_ratio = network["intra_node"]["bandwidth"]["value"] / network["inter_node"]["bandwidth"]["value"]
    assert set(table["bandwidth_ratio"].round(3)) == {round(system_ratio, 3), 16.0}  # the description's, and 16
    assert (table["rule_choice"] != "").all() and (table["search_choice"] != "").all()
    assert (table["rule_step"] >= table["search_step"] * (1 - 1e-9)).all()  # the search's is the best simulated
    assert ((table["agree"] == 1) == (table["rule_choice"] == table["search_choice"])).all()


@pytest.fixture
def existing(tmp_path):
    """An output file that must come through bad input byte for byte."""
    path = tmp_path / "existing.h5"
    result = search(["--system", A100, "--model", "tiny", "--gpus", "4", "--global-batch", "8", "--seq", "64", "-k", "1",
                     "-q", "-O", str(path)], tmp_path)
    assert result.returncode == 0, result.stderr
    return path


def bad(args, tmp_path, existing, expect: str):
    before = digest(str(existing))
    result = search([*args, "-O", str(existing)], tmp_path)
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert expect in result.stderr, result.stderr
    assert result.stderr.count("\n") >= 1 and "Traceback" not in result.stderr
    assert digest(str(existing)) == before
    return result


def test_devices_that_do_not_fit_the_grid_asked_for(tmp_path, existing):
    bad(["--system", A100, "--model", "gpt2-124m", "--gpus", "12", "--global-batch", "24", "--tp", "8"], tmp_path,
        existing, "no configuration")
    bad(["--system", A100, "--model", "gpt2-124m", "--gpus", "0", "--global-batch", "24"], tmp_path, existing,
        "--gpus N is required")


def test_a_system_description_missing_a_field(tmp_path, existing):
    with open(A100) as handle:
        system = json.load(handle)
    del system["device"]["devices_per_node"]
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(system))
    bad(["--system", str(broken), "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16"], tmp_path, existing,
        "devices_per_node")
    # Without a device memory the limit must be given.
    system = json.load(open(A100))
    del system["device"]["memory_capacity"]
    no_memory = tmp_path / "no-memory.json"
    no_memory.write_text(json.dumps(system))
    bad(["--system", str(no_memory), "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16"], tmp_path, existing,
        "--memory-limit")
    result = search(["--system", str(no_memory), "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16",
                     "--seq", "256", "--memory-limit", "40GB", "-k", "1", "-q", "-O", str(tmp_path / "ok.h5")], tmp_path)
    assert result.returncode == 0, result.stderr
    assert float(sr.read_table([str(tmp_path / "ok.h5")], "search")["memory_limit"][0]) == 40e9


def test_nothing_fits(tmp_path, existing):
    result = bad(["--system", A100, "--model", "gpt3-175b", "--gpus", "16", "--global-batch", "16", "--seq", "2048"],
                 tmp_path, existing, "no configuration")
    assert "memory: more memory per device than the limit" in result.stderr
    bad(["--system", A100, "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16", "--memory-limit", "1MB"],
        tmp_path, existing, "fits in 0.0 GB")


def test_other_bad_input(tmp_path, existing):
    bad(["--system", A100, "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16", "--recompute", "overlap"],
        tmp_path, existing, "measured placement")
    bad(["--system", A100, "--model", "no-such-model", "--gpus", "8", "--global-batch", "16"], tmp_path, existing,
        "no-such-model")
    bad(["--system", A100, "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16", "--strategies", "NXG"],
        tmp_path, existing, "X")
    bad(["--system", A100, "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16", "--dtype", "fp4"], tmp_path,
        existing, "fp4")
    bad(["--system", A100, "--model", "gpt2-124m", "--gpus", "8"], tmp_path, existing, "--global-batch")
    bad(["--system", A100, "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16", "--attention", "cudnn"],
        tmp_path, existing, "flash-triton")
    bad(["--system", A100, "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16", "--loss", "fp16"],
        tmp_path, existing, "fp32-fused")
    bad(["--system", A100, "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16", "--dropout", "maybe"],
        tmp_path, existing, "--dropout")
    bad(["--system", A100, "--compare-paro", "--paro-models", "gpt3-1.3b", "--attention", "flash-triton"], tmp_path,
        existing, "--compare-paro")
    bad(["--model", "gpt2-124m", "--gpus", "8", "--global-batch", "16"], tmp_path, existing, "--system")
