// Command-line parsing shared by every Strata program: long and short flags (`--iters 20`, `--iters=20`,
// `-n 20`), strict number parsing, sizes with K/M/G suffixes, and the resolved configuration as JSON so
// each run records exactly what it was asked to do. Bad input throws UsageError (exit code 2).
//
// The declarations are kept here and a CLI11 application is built from them for each parse and each usage
// text: aliases are declared after the option they name, and CLI11 cannot add a name to an option it holds,
// and the usage shows the values current when it is printed.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace CLI {
class App;
}

namespace strata {

// Strict parsers: the whole text must be a number; throw UsageError naming `what` otherwise.
int64_t parse_int(const std::string& text, const std::string& what);
double parse_double(const std::string& text, const std::string& what);
bool parse_bool(const std::string& text, const std::string& what);
// Bytes with optional binary suffix K, M, G (1K = 1024), as nccl-tests reads -b/-e.
int64_t parse_bytes(const std::string& text, const std::string& what);
std::vector<std::string> split(const std::string& text, char separator);
// A comma-separated list a user gave for `what` (e.g. "--shapes"): UsageError naming it when the list or any
// item is empty ("--shapes: empty item in '64x64x64,'"), so an empty value never runs nothing or a default.
std::vector<std::string> split_list(const std::string& text, const std::string& what);

// The names of a vocabulary's values (each by its name(), found beside its type), in the list's order: a flag's
// choices and its help text from the one list the code parses.
template <typename Values>
std::vector<std::string> names_of(const Values& values) {
  std::vector<std::string> names;
  for (const auto& value : values) names.emplace_back(name(value));
  return names;
}
// "a, b or c" with separator ", " and last " or "; "a,b,c" with "," and ",".
std::string join_names(const std::vector<std::string>& names, const std::string& separator = ", ",
                       const std::string& last = " or ");

class Cli {
 public:
  Cli(std::string program, std::string summary);

  // An option with a value. `parse` receives the text; `show` gives the current value as JSON.
  void add(const std::string& long_name, char short_name, const std::string& value_name, const std::string& help,
           std::function<void(const std::string&)> parse, std::function<nlohmann::json()> show);
  // A switch: `--name` sets true, `--name=false` / `--no-name` false.
  void flag(const std::string& long_name, char short_name, const std::string& help, bool& target);

  void option(const std::string& long_name, char short_name, const std::string& help, int& target, int min_value);
  void option(const std::string& long_name, char short_name, const std::string& help, int64_t& target,
              int64_t min_value);
  void option(const std::string& long_name, char short_name, const std::string& help, double& target,
              double min_value);
  // A text value; an empty one ("--shapes ''") is a usage error naming the option.
  void option(const std::string& long_name, char short_name, const std::string& help, std::string& target);
  // A value that must be one of `choices` (names_of a vocabulary's list, so the flag takes what the code knows).
  void choice(const std::string& long_name, char short_name, const std::string& help, std::string& target,
              std::vector<std::string> choices);

  // Another long name for an option already declared (nccl-tests spellings beside Strata's).
  void alias(const std::string& long_name, const std::string& existing);

  // The arguments without a flag (e.g. input files), in order; fewer than `minimum` is a usage error.
  void positionals(const std::string& name, const std::string& help, std::vector<std::string>& target,
                   size_t minimum);

  // Returns false when --help was asked for (usage printed to stdout), true otherwise.
  bool parse(int argc, const char* const* argv);
  // Whether the last parse() was given the option (by any of its names), so a default can be told from a
  // value the user chose.
  bool given(const std::string& long_name) const { return given_.count(long_name) > 0; }
  std::string usage() const;
  // {"option": value, ...} for every option, in declaration order, with the values after parsing.
  std::string resolved_json() const;

 private:
  struct Option {
    std::string long_name;
    char short_name;
    std::string value_name;  // empty for switches
    std::string help;
    std::function<void(const std::string&)> parse;
    std::function<nlohmann::json()> show;
    std::vector<std::string> aliases;
  };
  Option* find(const std::string& long_name);
  bool taken(const std::string& long_name) const;
  void build(CLI::App& app) const;

  struct Positionals {
    std::string name;
    std::string help;
    std::vector<std::string>* target = nullptr;
    size_t minimum = 0;
  };

  std::string program_;
  std::string summary_;
  mutable std::set<std::string> given_;
  std::vector<Option> options_;
  Positionals positionals_;
};

}  // namespace strata
