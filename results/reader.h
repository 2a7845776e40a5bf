// Reads Strata results files back into tables: what later benchmarks and the projection build on.
// Refuses files that are not Strata results or that use a newer major schema version (BadResultsFile). The file is
// read whole when it is opened (h5::walk): a damaged file is a BadResultsFile naming it, as is a file another writer
// holds.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "results/h5.h"
#include "results/table.h"

namespace strata {

class ResultsReader {
 public:
  explicit ResultsReader(const std::string& path);

  const std::string& schema_version() const { return version_; }
  std::vector<std::string> runs() const;
  std::map<std::string, std::string> run_attrs(const std::string& run_id) const;
  std::map<std::string, std::string> env(const std::string& run_id) const;
  std::vector<std::string> tables(const std::string& run_id) const;
  Table table(const std::string& run_id, const std::string& name) const;

 private:
  h5::Handle run(const std::string& run_id) const;
  Table read_table(const std::string& run_id, const std::string& name) const;
  // Runs a read, turning HDF5 failing underneath (a damaged file) into BadResultsFile naming the file.
  template <typename Read>
  auto guarded(Read&& read) const -> decltype(read());

  std::string path_;
  std::string version_;
  h5::Handle file_;
};

}  // namespace strata
