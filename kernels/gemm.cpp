// Implementation of the GEMM problem description (see gemm.h).
#include "kernels/gemm.h"

#include <cmath>

#include "bench/check.h"
#include "bench/cli.h"

namespace strata::gemm {

std::string name(DType dtype) {
  switch (dtype) {
    case DType::fp32: return "fp32";
    case DType::fp64: return "fp64";
    case DType::tf32: return "tf32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
    case DType::fp8_e4m3: return "fp8";
  }
  return "?";
}

std::optional<DType> parse_dtype(const std::string& text) {
  for (DType d : {DType::fp32, DType::fp64, DType::tf32, DType::fp16, DType::bf16, DType::fp8_e4m3})
    if (name(d) == text) return d;
  if (text == "fp8_e4m3" || text == "e4m3") return DType::fp8_e4m3;
  return std::nullopt;
}

int input_bytes(DType dtype) {
  switch (dtype) {
    case DType::fp64: return 8;
    case DType::fp32: case DType::tf32: return 4;
    case DType::fp16: case DType::bf16: return 2;
    case DType::fp8_e4m3: return 1;
  }
  return 0;
}

int output_bytes(DType dtype) { return dtype == DType::fp8_e4m3 ? 2 : input_bytes(dtype); }

Shape parse_shape(const std::string& text) {
  std::vector<std::string> parts = split(text, 'x');
  if (parts.size() != 3) throw UsageError("malformed shape '" + text + "': expected MxNxK, e.g. 4096x4096x4096");
  Shape s;
  int64_t* fields[3] = {&s.m, &s.n, &s.k};
  const char* names[3] = {"M", "N", "K"};
  for (int i = 0; i < 3; ++i) {
    *fields[i] = parse_int(parts[static_cast<size_t>(i)], std::string(names[i]) + " of shape '" + text + "'");
    if (*fields[i] <= 0) throw UsageError("shape '" + text + "': " + names[i] + " must be positive");
    if (*fields[i] > (int64_t{1} << 20)) throw UsageError("shape '" + text + "': " + names[i] + " is too large");
  }
  return s;
}

namespace {
struct Model {
  const char* name;
  int64_t hidden;
};
// GPT-2 (Radford et al. 2019) and GPT-3 (Brown et al. 2020) hidden sizes; the MLP is 4x hidden.
constexpr Model kModels[] = {{"gpt2-small", 768},  {"gpt2-medium", 1024}, {"gpt2-large", 1280},
                             {"gpt2-xl", 1600},    {"gpt3-1.3b", 2048},   {"gpt3-2.7b", 2560},
                             {"gpt3-6.7b", 4096},  {"gpt3-13b", 5120},    {"gpt3-175b", 12288}};
}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& m : kModels) names.emplace_back(m.name);
  return names;
}

std::vector<NamedShape> preset_shapes(const std::string& model, int64_t tokens, int tp) {
  if (tokens <= 0) throw UsageError("--tokens must be positive");
  if (tp <= 0) throw UsageError("--tp must be positive");
  for (const auto& m : kModels) {
    if (model != m.name) continue;
    int64_t h = m.hidden;
    if ((3 * h) % tp || h % tp || (4 * h) % tp)
      throw UsageError("tensor-parallel degree " + std::to_string(tp) + " does not divide the layers of " + model);
    std::string p = model + "/";
    return {{p + "qkv", {tokens, 3 * h / tp, h}},
            {p + "attn_out", {tokens, h, h / tp}},
            {p + "mlp_up", {tokens, 4 * h / tp, h}},
            {p + "mlp_down", {tokens, h, 4 * h / tp}}};
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError("unknown preset '" + model + "' (known: " + known + ")");
}

Precision precision(DType dtype) {
  const double u32 = std::ldexp(1.0, -24), u64 = std::ldexp(1.0, -53);
  switch (dtype) {
    case DType::fp64: return {0, u64, u64};
    case DType::fp32: return {0, u32, u32};
    case DType::tf32: return {std::ldexp(1.0, -11), u32, u32};
    case DType::fp16: return {0, u32, std::ldexp(1.0, -11)};
    case DType::bf16: return {0, u32, std::ldexp(1.0, -8)};
    case DType::fp8_e4m3: return {0, u32, std::ldexp(1.0, -8)};  // output stored as bf16
  }
  return {};
}

}  // namespace strata::gemm
