// GEMM shapes as users type them.
#pragma once

#include <string>

#include "kernels/gemm.h"

namespace strata::gemm {

// "4096x4096x4096" -> {4096, 4096, 4096}; throws UsageError naming the problem for malformed or non-positive
// sizes.
Shape parse_shape(const std::string& text);

}  // namespace strata::gemm
