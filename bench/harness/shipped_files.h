// The data files Strata ships (system descriptions, the published step set), found by name wherever Strata runs
// from: a build folder inside a checkout, or an install (cmake --install) moved to any prefix.
#pragma once

#include <string>
#include <vector>

namespace strata {

// The folders a shipped file of `subfolder` (e.g. "project/systems") may be in, in the order they are searched:
// $STRATA_DATA_DIR/<subfolder>, <the program's folder>/../share/strata/<subfolder> (an install), and
// <the program's folder>/../<subfolder> (a build folder in a checkout).
std::vector<std::string> shipped_folders(const std::string& subfolder);

// `argument` itself when it is an existing path or names a folder (contains '/'); otherwise the shipped file
// `argument` (".json" added when it has no extension) in the first of shipped_folders() that holds it; `argument`
// unchanged when none does, so the caller's message names what the user wrote.
std::string resolve_shipped_file(const std::string& argument, const std::string& subfolder);

// The names a shipped folder offers (file names without ".json"), sorted, for messages and --help.
std::vector<std::string> shipped_names(const std::string& subfolder);

}  // namespace strata
