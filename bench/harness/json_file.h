// JSON files a user hands a program (a system description, a recompute policy): read and parsed with messages
// that name the file and, for a value the parser cannot hold (1e999), the field it belongs to.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace strata {

// `what` names the input in messages, e.g. "system description". Throws UsageError: the file cannot be opened,
// is a directory, is not JSON (with the parser's position), holds a number out of range (with its field,
// e.g. "field device.peak.bf16: number 1e999 is out of range"), or names a key twice in one object (with its
// field: the parser would keep only the last value).
nlohmann::json read_json_file(const std::string& path, const std::string& what);

// The same for JSON text that came from somewhere else (`source` names it).
nlohmann::json parse_json_text(const std::string& text, const std::string& source);

}  // namespace strata
