// Implementation of shape parsing (see shapes.h).
#include "bench/harness/shapes.h"

#include "bench/harness/check.h"
#include "bench/harness/cli.h"

namespace strata::gemm {

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

}  // namespace strata::gemm
