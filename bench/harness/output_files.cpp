// Implementation of the output checks (see output_files.h).
#include "bench/harness/output_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "bench/harness/check.h"
#include "results/h5.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

std::string named(const FileArg& file) { return file.flag + " " + file.path; }

// Real probes rather than access(2): root passes access() checks on read-only file systems.
bool opens_for_writing(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);  // no O_TRUNC: the file is not changed
  if (fd < 0) return false;
  close(fd);
  return true;
}

bool takes_new_files(const fs::path& folder) {
  std::string probe = (folder / ".strata-write-probe-XXXXXX").string();
  const int fd = mkstemp(probe.data());
  if (fd < 0) return false;
  close(fd);
  unlink(probe.c_str());
  return true;
}

void check_replaceable(const FileArg& out) {
  std::error_code ec;
  const fs::file_status status = fs::status(out.path, ec);
  if (fs::is_directory(status)) throw UsageError(named(out) + " is a directory, not a file");
  if (fs::exists(status)) {
    if (!fs::is_regular_file(status)) throw UsageError(named(out) + " is not a regular file");
    if (h5::is_hdf5_file(out.path))
      throw UsageError(named(out) + " is an existing HDF5 file, which may hold results: refusing to overwrite it with " +
                       (out.what.empty() ? std::string("anything else") : out.what) + "; give another path");
    if (!opens_for_writing(out.path)) throw UsageError(named(out) + " is not writable");
  }
  fs::path folder = fs::path(out.path).parent_path();
  if (folder.empty()) folder = ".";
  if (!fs::is_directory(folder, ec)) throw UsageError(out.flag + ": folder " + folder.string() + " does not exist");
  if (!takes_new_files(folder)) throw UsageError(out.flag + ": folder " + folder.string() + " is not writable");
}

}  // namespace

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  std::error_code ea, eb;
  const fs::path ca = fs::weakly_canonical(a, ea), cb = fs::weakly_canonical(b, eb);
  return !ea && !eb ? ca == cb : fs::path(a).lexically_normal() == fs::path(b).lexically_normal();
}

void check_outputs(const std::vector<FileArg>& inputs, const std::vector<FileArg>& appended,
                   const std::vector<FileArg>& replaced) {
  std::vector<const FileArg*> outputs;
  for (const auto* list : {&appended, &replaced})
    for (const FileArg& out : *list)
      if (!out.path.empty()) outputs.push_back(&out);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const FileArg& out = *outputs[i];
    for (const FileArg& in : inputs)
      if (!in.path.empty() && same_file(out.path, in.path))
        throw UsageError(named(out) + " is also an input (" + named(in) +
                         "): a program never writes over a file it reads; give another output path");
    for (std::size_t j = 0; j < i; ++j)
      if (same_file(out.path, outputs[j]->path))
        throw UsageError(named(out) + " and " + named(*outputs[j]) + " are the same file: each output needs its own");
  }
  for (const FileArg& out : replaced)
    if (!out.path.empty()) check_replaceable(out);
}

}  // namespace strata
