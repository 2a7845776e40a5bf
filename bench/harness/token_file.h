// Token files in llm.c's format: a header of 256 int32 (magic 20240520, version 1, token count), then the
// tokens as uint16. Bad files throw UsageError naming the problem (exit 2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

std::vector<uint16_t> read_token_file(const std::string& path);

}  // namespace strata
