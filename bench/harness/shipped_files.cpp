// Implementation of the shipped-file lookup (see shipped_files.h).
#include "bench/harness/shipped_files.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace strata {

namespace fs = std::filesystem;

namespace {

fs::path program_folder() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  return error ? fs::path() : self.parent_path();
}

}  // namespace

std::vector<std::string> shipped_folders(const std::string& subfolder) {
  std::vector<std::string> folders;
  if (const char* data = std::getenv("STRATA_DATA_DIR"); data && *data) folders.push_back((fs::path(data) / subfolder).string());
  const fs::path here = program_folder();
  if (!here.empty()) {
    folders.push_back((here / ".." / "share" / "strata" / subfolder).lexically_normal().string());
    folders.push_back((here / ".." / subfolder).lexically_normal().string());
  }
  return folders;
}

std::string resolve_shipped_file(const std::string& argument, const std::string& subfolder) {
  std::error_code error;
  if (argument.empty() || argument.find('/') != std::string::npos || fs::exists(argument, error)) return argument;
  const std::string name = fs::path(argument).has_extension() ? argument : argument + ".json";
  for (const std::string& folder : shipped_folders(subfolder)) {
    const fs::path candidate = fs::path(folder) / name;
    if (fs::is_regular_file(candidate, error)) return candidate.string();
  }
  return argument;
}

std::vector<std::string> shipped_names(const std::string& subfolder) {
  std::vector<std::string> names;
  for (const std::string& folder : shipped_folders(subfolder)) {
    std::error_code error;
    for (const auto& entry : fs::directory_iterator(folder, error))
      if (entry.path().extension() == ".json") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

}  // namespace strata
