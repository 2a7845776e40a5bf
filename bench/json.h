// The little JSON the harness writes (resolved configuration, context): strings escaped, numbers exact.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace strata {

std::string json_string(const std::string& text);
std::string json_number(double value);
std::string json_number(long long value);
std::string json_array_of_strings(const std::vector<std::string>& items);
// Members are already-rendered JSON values.
std::string json_object(const std::vector<std::pair<std::string, std::string>>& members);

}  // namespace strata
