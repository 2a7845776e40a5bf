// Implementation of the JSON file reader (see json_file.h).
#include "bench/harness/json_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>
#include <vector>

#include "bench/harness/check.h"

namespace strata {

namespace {

using nlohmann::json;

// The dotted path of the key being read ("device.peak.bf16"), kept by the parser's callback so an error
// thrown while reading a value can say which field it was.
struct FieldTracker {
  std::vector<std::string> keys;  // one per open object; "" until its first key
  std::vector<std::unordered_set<std::string>> seen;  // the keys each open object has had so far

  std::string path() const {
    std::string text;
    for (const std::string& key : keys)
      if (!key.empty()) text += (text.empty() ? "" : ".") + key;
    return text;
  }
};

}  // namespace

json parse_json_text(const std::string& text, const std::string& source) {
  FieldTracker field;
  json::parser_callback_t track = [&field, &source](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        field.keys.resize(static_cast<size_t>(depth) + 1);
        field.keys.back().clear();
        field.seen.resize(static_cast<size_t>(depth) + 1);
        field.seen.back().clear();
        break;
      case json::parse_event_t::key:
        if (depth >= 1 && static_cast<size_t>(depth) <= field.keys.size()) {
          const size_t object = static_cast<size_t>(depth) - 1;
          field.keys[object] = parsed.get<std::string>();
          // The parser would keep the last of the two values, and the file's reader would never know of the first.
          if (!field.seen[object].insert(field.keys[object]).second)
            throw UsageError(source + ": field " + field.path() + " appears twice in its object");
        }
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        field.keys.resize(static_cast<size_t>(depth));
        field.seen.resize(static_cast<size_t>(depth));
        break;
      case json::parse_event_t::value:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, track);
  } catch (const json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 3, column 7: ..." without the library's tag.
    std::string message = e.what();
    if (const size_t tag = message.find("] "); tag != std::string::npos) message = message.substr(tag + 2);
    throw UsageError(source + ": not JSON: " + message);
  } catch (const json::out_of_range& e) {  // a number beyond double's range, e.g. 1e999
    std::string message = e.what();
    if (const size_t tag = message.find("] "); tag != std::string::npos) message = message.substr(tag + 2);
    const std::string where = field.path();
    throw UsageError(source + ": " + (where.empty() ? "" : "field " + where + ": ") + message);
  }
}

json read_json_file(const std::string& path, const std::string& what) {
  if (std::filesystem::is_directory(path)) throw UsageError(what + " " + path + " is a directory");
  std::ifstream in(path);
  if (!in) throw UsageError(what + " " + path + ": cannot open the file");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_json_text(text.str(), what + " " + path);
}

}  // namespace strata
