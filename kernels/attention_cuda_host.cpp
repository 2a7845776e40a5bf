// The host side of the GPU attention backends (see attention_cuda.h): names, parsing and validation, built
// with or without CUDA so the CPU build tests what a request is allowed to be.
#include <climits>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>

#include "kernels/attention_cuda.h"
#include "kernels/flash_layout.h"

namespace strata::attention::gpu {

namespace {
double rows_of(const Shape& s) { return static_cast<double>(s.batch) * s.heads_q * s.seq_q; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
}  // namespace

std::string name(Impl impl) { return impl == Impl::flash ? "flash" : "unfused"; }
std::string name(DType dtype) { return dtype == DType::bf16 ? "bf16" : "fp16"; }

std::optional<Impl> parse_impl(const std::string& text) {
  if (text == "unfused") return Impl::unfused;
  if (text == "flash") return Impl::flash;
  return std::nullopt;
}

std::optional<DType> parse_dtype(const std::string& text) {
  if (text == "fp16") return DType::fp16;
  if (text == "bf16") return DType::bf16;
  return std::nullopt;
}

std::size_t unfused_workspace_bytes(const Shape& s) {
  const double bytes = static_cast<double>(s.batch) * s.heads_q * s.seq_q * s.seq_kv * 8.0;
  return bytes >= static_cast<double>(std::numeric_limits<std::size_t>::max() / 2)
             ? std::numeric_limits<std::size_t>::max()
             : static_cast<std::size_t>(bytes);
}

std::string validate(const Shape& s, DType dtype, Impl impl) {
  if (dtype != DType::fp16 && dtype != DType::bf16) return "unknown dtype (the gpu kernels take fp16 or bf16)";
  if (impl != Impl::unfused && impl != Impl::flash) return "unknown attention implementation (unfused or flash)";
  if (std::string problem = attention::validate(s); !problem.empty()) return problem;
  // Row-wise kernels and the flash grids index blocks with int.
  if (rows_of(s) > INT_MAX) return "batch * heads_q * seq_q exceeds the int range of the gpu kernels' grids";
  if (impl == Impl::flash) {
    if (s.head_dim != 64 && s.head_dim != 128)
      return "flash attention supports head_dim 64 and 128 only (got " + std::to_string(s.head_dim) + ")";
    if (static_cast<double>(ceil_div(s.seq_q, layout::kFwdRows)) * s.batch * s.heads_q > INT_MAX ||
        static_cast<double>(ceil_div(s.seq_kv, layout::kBwdKeys)) * s.batch * s.heads_kv > INT_MAX)
      return "flash attention grid exceeds the int range";
  } else {
    const std::size_t bytes = unfused_workspace_bytes(s);
    if (bytes > kUnfusedWorkspaceLimitBytes) {
      char text[200];
      std::snprintf(text, sizeof text,
                    "unfused attention materialises batch*heads_q*seq_q*seq_kv scores: %.2f GiB of workspace "
                    "exceeds its %.0f GiB limit (use flash)",
                    static_cast<double>(bytes) / (1u << 30),
                    static_cast<double>(kUnfusedWorkspaceLimitBytes) / (1u << 30));
      return text;
    }
  }
  return "";
}

}  // namespace strata::attention::gpu
