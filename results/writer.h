// Writes one benchmark run into a Strata results file (schema in results/SCHEMA.md). Used by rank 0 only:
// the harness gathers every rank's data first. A run is created with status "interrupted" and every table
// append is flushed, so a killed job leaves a readable file with each completed case and an honest status.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "results/h5.h"
#include "results/table.h"

namespace strata {

// Checks that `path` can take a new run without harm: a missing file in a writable folder, or an existing,
// writable Strata file of a major version this program understands whose every object reads back (h5::walk) and
// that has its runs group, every run of it with the attributes of schema::kRunAttributes.
// Throws BadResultsFile naming the problem. A file another writer holds is checked when the writer opens it.
void validate_output_path(const std::string& path);

// Two writers of one file: HDF5 holds an exclusive lock (flock) on a file while it is open for writing, so a second
// writer waits for it, up to STRATA_LOCK_WAIT seconds (default 30; 0: refuse at once), then refuses with
// FileInUse. Readers do not wait: a file being written is refused at once.
inline constexpr const char* kLockWaitVariable = "STRATA_LOCK_WAIT";
inline constexpr double kDefaultLockWait = 30;
double lock_wait_seconds();  // BadResultsFile when STRATA_LOCK_WAIT is not a number of seconds >= 0
bool held_by_writer(const std::string& path);
std::string in_use_message(const std::string& path);

struct FileInUse : BadResultsFile {
  using BadResultsFile::BadResultsFile;
};

// Refuses files that are not HDF5, not Strata results, or of a newer major version (BadResultsFile).
// Returns "major.minor".
std::string check_strata_file(const h5::Handle& file, const std::string& path);

// A sortable, unique run id: UTC start time to the microsecond, then random hex.
std::string new_run_id();
std::string utc_now_iso();

// Test hook: with this environment variable set to N > 0, the writer flushes and raises SIGKILL after its
// N-th column append, so a test can kill a real writer between the columns of one table append.
inline constexpr const char* kTestKillAfterColumns = "STRATA_TEST_KILL_AFTER_COLUMNS";

class ResultsWriter {
 public:
  // Opens (or creates) the file and creates /runs/<run_id> with the given attributes, which must hold every name of
  // schema::kRunAttributes but "status" (the writer's own): ResultsError before the file is touched otherwise. When
  // another writer holds the file, waits for it (lock_wait_seconds(); `on_wait` is called once when the wait begins)
  // and throws FileInUse if it is still held after that.
  ResultsWriter(const std::string& path, const std::string& run_id, const std::map<std::string, std::string>& run_attrs,
                const std::function<void(double seconds)>& on_wait = {});

  const std::string& run_id() const { return run_id_; }
  const std::string& path() const { return path_; }

  void set_run_attr(const std::string& name, const std::string& value);
  void set_run_attr(const std::string& name, int64_t value);
  void write_env(const std::map<std::string, std::string>& env);
  // Appends the table's rows to the run's table of the same name, creating it (with units) on first use.
  void append(const Table& rows);
  void flush();
  // Records how the run ended ("ok", "failed", "interrupted") and when.
  void finish(const std::string& status);

 private:
  void after_column_append();

  std::string path_;
  std::string run_id_;
  int64_t kill_after_columns_ = 0;
  int64_t columns_appended_ = 0;
  h5::Handle file_;
  h5::Handle run_;
};

}  // namespace strata
