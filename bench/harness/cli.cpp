// Implementation of the command-line parser (see cli.h) on CLI11.
#include "bench/harness/cli.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "bench/harness/check.h"

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
  throw UsageError("invalid value '" + text + "' for " + what + ": expected on/off, true/false, yes/no or 1/0");
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
  int64_t value = 0;
  try {
    value = parse_int(digits, what);
  } catch (const UsageError&) {
    throw UsageError("invalid size '" + text + "' for " + what + ": a whole number of bytes, optionally with K, M or G");
  }
  if (value < 0) throw UsageError("negative size '" + text + "' for " + what);
  if (value > std::numeric_limits<int64_t>::max() / multiplier)
    throw UsageError("size '" + text + "' for " + what + " is too large (at most 8 EiB)");
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

std::vector<std::string> split_list(const std::string& text, const std::string& what) {
  if (text.empty()) throw UsageError(what + ": empty list");
  std::vector<std::string> items = split(text, ',');
  for (const std::string& item : items)
    if (item.empty()) throw UsageError(what + ": empty item in '" + text + "'");
  return items;
}

namespace {

// The shortest text that reads back as `value` (0 rather than 0.0 or 0.00000000000000000).
std::string shortest(double value) {
  std::array<char, 32> buffer{};
  auto [end, ec] = std::to_chars(buffer.data(), buffer.data() + buffer.size(), value);
  return ec == std::errc() ? std::string(buffer.data(), end) : std::to_string(value);
}

// A value as the usage shows it: strings without JSON quotes, 0 rather than 0.0.
std::string plain(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_number_float()) return shortest(value.get<double>());
  return value.dump();
}

}  // namespace

Cli::Cli(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

bool Cli::taken(const std::string& long_name) const {
  return std::any_of(options_.begin(), options_.end(), [&](const Option& o) {
    return o.long_name == long_name || std::find(o.aliases.begin(), o.aliases.end(), long_name) != o.aliases.end();
  });
}

Cli::Option* Cli::find(const std::string& long_name) {
  for (auto& o : options_)
    if (o.long_name == long_name) return &o;
  return nullptr;
}

void Cli::add(const std::string& long_name, char short_name, const std::string& value_name, const std::string& help,
              std::function<void(const std::string&)> parse, std::function<nlohmann::json()> show) {
  bool short_taken = short_name && std::any_of(options_.begin(), options_.end(),
                                               [&](const Option& o) { return o.short_name == short_name; });
  if (taken(long_name) || short_taken) throw RuntimeError("option declared twice: --" + long_name);
  options_.push_back(Option{long_name, short_name, value_name, help, std::move(parse), std::move(show), {}});
}

void Cli::flag(const std::string& long_name, char short_name, const std::string& help, bool& target) {
  add(long_name, short_name, "", help,
      [&target, long_name](const std::string& text) { target = parse_bool(text, "--" + long_name); },
      [&target] { return nlohmann::json(target); });
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
      [&target] { return nlohmann::json(target); });
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
      [&target] { return nlohmann::json(target); });
}

void Cli::option(const std::string& long_name, char short_name, const std::string& help, double& target,
                 double min_value) {
  add(long_name, short_name, "X", help,
      [&target, long_name, min_value](const std::string& text) {
        double value = parse_double(text, "--" + long_name);
        if (value < min_value)
          throw UsageError("--" + long_name + " must be at least " + shortest(min_value) + ", got " + text);
        target = value;
      },
      [&target] { return nlohmann::json(target); });
}

void Cli::option(const std::string& long_name, char short_name, const std::string& help, std::string& target) {
  add(long_name, short_name, "TEXT", help,
      [&target, long_name](const std::string& text) {
        if (text.empty()) throw UsageError("--" + long_name + ": empty value");
        target = text;
      },
      [&target] { return nlohmann::json(target); });
}

void Cli::choice(const std::string& long_name, char short_name, const std::string& help, std::string& target,
                 std::vector<std::string> choices) {
  std::string joined;
  for (const auto& c : choices) joined += (joined.empty() ? "" : "|") + c;
  // Checked here rather than with CLI::IsMember, whose message names neither the value's option nor the choices
  // the way the rest of Strata's messages do.
  add(long_name, short_name, joined, help,
      [&target, long_name, choices, joined](const std::string& text) {
        if (std::find(choices.begin(), choices.end(), text) == choices.end())
          throw UsageError("invalid value '" + text + "' for --" + long_name + ": expected one of " + joined);
        target = text;
      },
      [&target] { return nlohmann::json(target); });
}

void Cli::alias(const std::string& long_name, const std::string& existing) {
  Option* option = find(existing);
  if (!option) throw RuntimeError("alias of an undeclared option: --" + existing);
  if (taken(long_name)) throw RuntimeError("option declared twice: --" + long_name);
  option->aliases.push_back(long_name);
}

void Cli::positionals(const std::string& name, const std::string& help, std::vector<std::string>& target,
                      size_t minimum) {
  positionals_ = {name, help, &target, minimum};
}

void Cli::build(CLI::App& app) const {
  app.name(program_);
  app.description(summary_);
  // Unknown arguments are collected and reported below in Strata's words rather than as CLI11's ExtrasError.
  app.allow_extras();
  app.set_help_flag("-h,--help", "this text");
  auto formatter = std::make_shared<CLI::Formatter>();
  formatter->label("Usage", "usage");
  formatter->label("OPTIONS", "options");
  formatter->column_width(34);
  app.formatter(formatter);
  for (const Option& o : options_) {
    std::string names = o.short_name ? std::string("-") + o.short_name + ",--" + o.long_name : "--" + o.long_name;
    for (const auto& alias : o.aliases) names += ",--" + alias;
    auto parse = [this, inner = o.parse, name = o.long_name](const std::string& text) {
      given_.insert(name);
      inner(text);
    };
    // Values are applied as they are read, in command-line order (trigger_on_parse), so `--quiet --no-quiet`
    // ends false and the first bad value on the line is the one reported.
    if (o.value_name.empty()) {
      // CLI11 hands a switch "true" or the text after '='; parse_bool judges both. The negation is an option of
      // its own, hidden (empty group), because CLI11's `!--no-name` shows in the usage as `--no-name{false}`.
      app.add_flag(names, o.help)->each([parse](const std::string& text) { parse(text); })->trigger_on_parse();
      std::string negation = "--no-" + o.long_name;
      app.add_flag(negation)
          ->group("")
          ->each([parse, negation](const std::string& text) { parse(parse_bool(text, negation) ? "false" : "true"); })
          ->trigger_on_parse();
    } else {
      app.add_option(names, o.help)
          ->type_name(o.value_name)
          ->default_str(plain(o.show()))
          ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
          ->each([parse](const std::string& text) { parse(text); })
          ->trigger_on_parse();
    }
  }
  if (positionals_.target) {
    // Bound to the vector itself: CLI11 2.1 gives a callback-only positional a single value.
    app.add_option(positionals_.name, *positionals_.target, positionals_.help)->type_name("");
  }
}

bool Cli::parse(int argc, const char* const* argv) {
  // CLI11 reads `--name=` as `--name` and then takes the next argument as the value; Strata reads it as an
  // empty value (e.g. `--grid-dim=`, the default). CLI11 also wants the arguments last first.
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.size() > 3 && arg.rfind("--", 0) == 0 && arg.back() == '=' && arg.find('=') == arg.size() - 1) {
      args.push_back(arg.substr(0, arg.size() - 1));
      args.emplace_back();
    } else {
      args.push_back(std::move(arg));
    }
  }
  std::reverse(args.begin(), args.end());

  CLI::App app;
  build(app);
  given_.clear();
  if (positionals_.target) positionals_.target->clear();
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    std::fputs(usage().c_str(), stdout);
    return false;
  } catch (const CLI::ArgumentMismatch& e) {
    // The only mismatch these declarations allow: a value missing at the end of the line ("--iters: 1 required
    // N missing").
    std::string message = e.what();
    throw UsageError("flag " + message.substr(0, message.find(':')) + " needs a value");
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  std::vector<std::string> extras = app.remaining();
  if (!extras.empty()) {
    const std::string& arg = extras.front();
    if (arg.rfind("--", 0) == 0 && arg.size() > 2)
      throw UsageError("unknown flag " + arg.substr(0, arg.find('=')) + " (see --help)");
    if (arg.size() >= 2 && arg[0] == '-')
      throw UsageError("unknown flag " + arg.substr(0, 2) + " (see --help)");
    throw UsageError("unexpected argument '" + arg + "' (see --help)");
  }
  if (positionals_.target && positionals_.target->size() < positionals_.minimum)
    throw UsageError("expected at least " + std::to_string(positionals_.minimum) + " " + positionals_.name +
                     " argument" + (positionals_.minimum > 1 ? "s" : "") + " (see --help)");
  return true;
}

std::string Cli::usage() const {
  CLI::App app;
  build(app);
  return app.help();
}

std::string Cli::resolved_json() const {
  nlohmann::ordered_json resolved = nlohmann::ordered_json::object();
  for (const auto& o : options_) resolved[o.long_name] = o.show();
  if (positionals_.target) resolved[positionals_.name] = *positionals_.target;
  return resolved.dump();
}

std::string join_names(const std::vector<std::string>& names, const std::string& separator, const std::string& last) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? last : separator) + names[i];
  return text;
}

}  // namespace strata
