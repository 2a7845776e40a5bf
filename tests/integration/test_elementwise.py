"""strata-elementwise under a real mpirun with 2 ranks: the step's elementwise kernels at a preset's shapes, each
checked against float64, bytes as the step's trace counts them, the rate column, tensor-parallel shapes, and bad input
(exit 2, an existing results file untouched)."""
from __future__ import annotations

import pytest

import strata_results as sr
from conftest import digest, mpirun, program

KERNELS = {"layernorm_forward", "layernorm_backward", "gelu_forward", "gelu_backward", "residual_forward", "copy",
           "permute_qkv", "permute_heads", "add_bias", "fill_bias", "bias_gradient", "accumulate", "adamw", "squared_norm", "cross_entropy_forward",
           "cross_entropy_row_max", "cross_entropy_row_sum_exp", "cross_entropy_backward"}


def elementwise(args, tmp_path, name="e.h5"):
    out = tmp_path / name
    result = mpirun(2, [program("strata-elementwise"), "-q", "-n", "3", "-w", "1", "--output", str(out), *args],
                    cwd=str(tmp_path))
    return result, out


def test_every_kernel_checked_with_the_traces_bytes(tmp_path):
    result, out = elementwise(["--preset", "tiny", "--tokens", "32"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = sr.read_cases_with_summary(str(out), "strata-elementwise").set_index("kernel")
    assert set(data.index) == KERNELS
    assert (data["wrong_elements"] == 0).all() and (data["check_worst_ratio"] <= 1).all()
    rows, c, f = 32, 64, 256  # tiny: hidden 64, MLP 4 x 64
    assert data.loc["gelu_forward", "elements"] == 2 * rows * f
    assert data.loc["layernorm_backward", "elements"] == 4 * rows * c + 2 * rows
    assert data.loc["permute_qkv", "elements"] == 2 * rows * 3 * c  # q, k and v of 4 heads of 16
    vocab = 256
    assert data.loc["cross_entropy_forward", "elements"] == rows * vocab + 4 * rows
    assert data.loc["cross_entropy_backward", "elements"] == 2 * rows * vocab
    assert (data["bytes"] == 4 * data["elements"]).all()
    # The optimizer's operands are timed outside the core's private caches, the others where the step leaves them.
    cold = {"adamw", "squared_norm"}
    assert (data.loc[sorted(cold), "evict_bytes"] > 0).all()
    assert (data.loc[sorted(KERNELS - cold), "evict_bytes"] == 0).all()
    assert data["bandwidth_rank"].to_numpy() == pytest.approx((data["bytes"] / data["time_rankmean_median"]).to_numpy())


def test_tensor_parallel_shapes_split_the_mlp_and_the_vocabulary(tmp_path):
    result, out = elementwise(["--preset", "tiny", "--tokens", "32", "--tp", "2", "-k",
                               "gelu_backward,adamw,cross_entropy_row_sum_exp"], tmp_path)
    assert result.returncode == 0, result.stderr
    data = sr.read_cases_with_summary(str(out), "strata-elementwise").set_index("kernel")
    assert data.loc["gelu_backward", "elements"] == 4 * 32 * 128
    assert data.loc["cross_entropy_row_sum_exp", "elements"] == 32 * 128 + 2 * 32  # half the vocabulary's 256 columns
    h, q, a, f = 64, 3 * 64 // 2, 64 // 2, 256 // 2  # one of two ranks' heads and MLP columns
    assert data.loc["adamw", "elements"] == 7 * (4 * h + (q * h + q) + (a * h + h) + (f * h + f) + (h * f + h))


@pytest.mark.parametrize("args, message", [
    (["-k", "softmax"], "--kernels: unknown kernel 'softmax'"),
    (["--preset", "tiny", "--tp", "3"], "--tp 3 on tiny"),
    (["--preset", "nonesuch"], "--preset"),
    (["--tokens", "0"], "--tokens"),
])
def test_bad_input_exits_2_and_leaves_the_file(tmp_path, args, message):
    result, out = elementwise(["--preset", "tiny", "--tokens", "16", "-k", "copy"], tmp_path)
    assert result.returncode == 0, result.stderr
    before = digest(str(out))
    result, _ = elementwise(args, tmp_path)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert digest(str(out)) == before
