// Implementation of the command-line parser (see cli.h).
#include "bench/cli.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "bench/check.h"
#include "bench/json.h"

namespace strata {

int64_t parse_int(const std::string& text, const std::string& what) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    throw UsageError("invalid value '" + text + "' for " + what + ": expected an integer");
  return value;
}

double parse_double(const std::string& text, const std::string& what) {
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || end != text.c_str() + text.size() || !std::isfinite(value))
    throw UsageError("invalid value '" + text + "' for " + what + ": expected a number");
  return value;
}

bool parse_bool(const std::string& text, const std::string& what) {
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  if (text == "0" || text == "false" || text == "no" || text == "off") return false;
  throw UsageError("invalid value '" + text + "' for " + what + ": expected 0/1, true/false");
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
  if (text.empty()) throw UsageError("empty size for " + what);
  int64_t multiplier = 1;
  std::string digits = text;
  switch (text.back()) {
    case 'K': case 'k': multiplier = int64_t{1} << 10; digits.pop_back(); break;
    case 'M': case 'm': multiplier = int64_t{1} << 20; digits.pop_back(); break;
    case 'G': case 'g': multiplier = int64_t{1} << 30; digits.pop_back(); break;
    default: break;
  }
  int64_t value = parse_int(digits, what);
  if (value < 0) throw UsageError("negative size '" + text + "' for " + what);
  return value * multiplier;
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream stream(text);
  while (std::getline(stream, part, separator)) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.emplace_back();
  return parts;
}

Cli::Cli(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

void Cli::add(const std::string& long_name, char short_name, const std::string& value_name, const std::string& help,
              std::function<void(const std::string&)> parse, std::function<std::string()> show) {
  if (find_long(long_name) || (short_name && find_short(short_name)))
    throw RuntimeError("option declared twice: --" + long_name);
  options_.push_back(Option{long_name, short_name, value_name, help, std::move(parse), std::move(show)});
}

void Cli::flag(const std::string& long_name, char short_name, const std::string& help, bool& target) {
  add(long_name, short_name, "", help,
      [&target, long_name](const std::string& text) { target = parse_bool(text, "--" + long_name); },
      [&target] { return std::string(target ? "true" : "false"); });
}

void Cli::option(const std::string& long_name, char short_name, const std::string& help, int& target,
                 int min_value) {
  add(long_name, short_name, "N", help,
      [&target, long_name, min_value](const std::string& text) {
        int64_t value = parse_int(text, "--" + long_name);
        if (value < min_value || value > 1'000'000'000)
          throw UsageError("--" + long_name + " must be between " + std::to_string(min_value) +
                           " and 1000000000, got " + text);
        target = static_cast<int>(value);
      },
      [&target] { return json_number(static_cast<long long>(target)); });
}

void Cli::option(const std::string& long_name, char short_name, const std::string& help, int64_t& target,
                 int64_t min_value) {
  add(long_name, short_name, "N", help,
      [&target, long_name, min_value](const std::string& text) {
        int64_t value = parse_int(text, "--" + long_name);
        if (value < min_value)
          throw UsageError("--" + long_name + " must be at least " + std::to_string(min_value) + ", got " + text);
        target = value;
      },
      [&target] { return json_number(static_cast<long long>(target)); });
}

void Cli::option(const std::string& long_name, char short_name, const std::string& help, double& target,
                 double min_value) {
  add(long_name, short_name, "X", help,
      [&target, long_name, min_value](const std::string& text) {
        double value = parse_double(text, "--" + long_name);
        if (value < min_value)
          throw UsageError("--" + long_name + " must be at least " + json_number(min_value) + ", got " + text);
        target = value;
      },
      [&target] { return json_number(target); });
}

void Cli::option(const std::string& long_name, char short_name, const std::string& help, std::string& target) {
  add(long_name, short_name, "TEXT", help, [&target](const std::string& text) { target = text; },
      [&target] { return json_string(target); });
}

void Cli::choice(const std::string& long_name, char short_name, const std::string& help, std::string& target,
                 std::vector<std::string> choices) {
  std::string joined;
  for (const auto& c : choices) joined += (joined.empty() ? "" : "|") + c;
  add(long_name, short_name, joined, help,
      [&target, long_name, choices, joined](const std::string& text) {
        for (const auto& c : choices)
          if (c == text) {
            target = text;
            return;
          }
        throw UsageError("invalid value '" + text + "' for --" + long_name + ": expected one of " + joined);
      },
      [&target] { return json_string(target); });
}

void Cli::alias(const std::string& long_name, const std::string& existing) {
  if (!find_long(existing)) throw RuntimeError("alias of an undeclared option: --" + existing);
  aliases_.emplace_back(long_name, existing);
}

const Cli::Option* Cli::find_long(const std::string& name) const {
  for (const auto& o : options_)
    if (o.long_name == name) return &o;
  for (const auto& [alias, existing] : aliases_)
    if (alias == name) return find_long(existing);
  return nullptr;
}

const Cli::Option* Cli::find_short(char name) const {
  for (const auto& o : options_)
    if (o.short_name == name) return &o;
  return nullptr;
}

bool Cli::parse(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(usage().c_str(), stdout);
      return false;
    }
    const Option* option = nullptr;
    std::string value;
    bool has_value = false;
    std::string shown = arg;
    if (arg.rfind("--", 0) == 0 && arg.size() > 2) {
      std::string name = arg.substr(2);
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        has_value = true;
      }
      shown = "--" + name;
      option = find_long(name);
      if (!option && name.rfind("no-", 0) == 0 && !has_value) {
        const Option* negated = find_long(name.substr(3));
        if (negated && negated->value_name.empty()) {
          negated->parse("false");
          continue;
        }
      }
    } else if (arg.size() >= 2 && arg[0] == '-' && arg[1] != '-') {
      option = find_short(arg[1]);
      shown = arg.substr(0, 2);
      if (arg.size() > 2) {
        value = arg.substr(2);
        has_value = true;
      }
    } else {
      throw UsageError("unexpected argument '" + arg + "' (see --help)");
    }
    if (!option) throw UsageError("unknown flag " + shown + " (see --help)");
    if (option->value_name.empty()) {
      option->parse(has_value ? value : "true");
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) throw UsageError("flag " + shown + " needs a value (" + option->value_name + ")");
      value = argv[++i];
    }
    option->parse(value);
  }
  return true;
}

std::string Cli::usage() const {
  std::string text = "usage: " + program_ + " [options]\n" + summary_ + "\n\noptions:\n";
  for (const auto& o : options_) {
    std::string names = "  ";
    names += o.short_name ? std::string("-") + o.short_name + ", " : "    ";
    names += "--" + o.long_name;
    if (!o.value_name.empty()) names += " " + o.value_name;
    if (names.size() < 34) names.resize(34, ' ');
    std::string also;
    for (const auto& [alias, existing] : aliases_)
      if (existing == o.long_name) also += (also.empty() ? " (also --" : ", --") + alias;
    if (!also.empty()) also += ")";
    text += names + " " + o.help + also + " [" + o.show() + "]\n";
  }
  text += "  -h, --help                       this text\n";
  return text;
}

std::string Cli::resolved_json() const {
  std::vector<std::pair<std::string, std::string>> members;
  for (const auto& o : options_) members.emplace_back(o.long_name, o.show());
  return json_object(members);
}

}  // namespace strata
