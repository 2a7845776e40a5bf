// The files a program reads and writes, checked together before anything is written: no program writes over a
// file it reads, writes two outputs to one file, or replaces an HDF5 file (which may hold results) with anything
// else. Every refusal names the flag and the file (UsageError, exit 2).
#pragma once

#include <string>
#include <vector>

namespace strata {

// A file named on the command line: the flag that named it ("-o/--output", "--timeline", "FILE" for a positional
// argument), its path, and for an output written whole, what it holds ("a Chrome trace").
struct FileArg {
  std::string flag;
  std::string path;
  std::string what;
};

// Refuses an output (empty paths are skipped) that is one of the inputs or another output, by path or, for files
// that exist, by device and inode (a link or another spelling of the same file). `replaced` outputs, written whole,
// must besides not be an existing HDF5 file, a folder or another non-regular file, and must be writable in a folder
// that exists and takes new files (they are written beside and renamed). `appended` outputs are results files that
// a run is appended to; validate_output_path (results/writer.h) checks the rest of them.
void check_outputs(const std::vector<FileArg>& inputs, const std::vector<FileArg>& appended,
                   const std::vector<FileArg>& replaced);

// Whether two paths name the same file: by device and inode where both exist, else by their canonical paths.
bool same_file(const std::string& a, const std::string& b);

}  // namespace strata
