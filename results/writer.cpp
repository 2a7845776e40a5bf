// Implementation of the results writer (see writer.h).
#include "results/writer.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdlib>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <random>
#include <string_view>
#include <thread>

#include "results/schema.h"

namespace strata {

namespace fs = std::filesystem;

namespace {
// Real probes rather than access(2): root passes access() checks on read-only file systems.
bool can_open_for_writing(const std::string& path) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);  // no O_TRUNC: the file is not changed
  if (fd < 0) return false;
  close(fd);
  return true;
}

bool can_create_in(const fs::path& folder) {
  std::string probe = (folder / ".strata-write-probe-XXXXXX").string();
  int fd = mkstemp(probe.data());
  if (fd < 0) return false;
  close(fd);
  unlink(probe.c_str());
  return true;
}
}  // namespace

std::string check_strata_file(const h5::Handle& file, const std::string& path) {
  auto name = h5::read_string_attr(file, "schema");
  if (!name || *name != schema::kName)
    throw BadResultsFile(path + " is an HDF5 file but not a Strata results file (no schema=\"" +
                     std::string(schema::kName) + "\" attribute)");
  auto major = h5::read_int_attr(file, "schema_version_major");
  auto minor = h5::read_int_attr(file, "schema_version_minor");
  if (!major || !minor) throw BadResultsFile(path + " is a Strata file without a schema version");
  std::string version = std::to_string(*major) + "." + std::to_string(*minor);
  if (*major > schema::kVersionMajor)
    throw BadResultsFile(path + " uses Strata results schema " + version + ", newer than this program's " +
                     std::to_string(schema::kVersionMajor) + "." + std::to_string(schema::kVersionMinor) +
                     ": use a newer Strata");
  return version;
}

namespace {

// Who holds the file's lock. HDF5 takes an exclusive flock on a file it opens for writing and a shared one on a
// file it opens for reading, and keeps it until the file is closed.
enum class Holder { none, readers, writer };

Holder lock_holder(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Holder::none;
  Holder holder = Holder::none;
  if (flock(fd, LOCK_SH | LOCK_NB) != 0) holder = errno == EWOULDBLOCK ? Holder::writer : Holder::none;
  else if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) holder = Holder::readers;
  close(fd);  // releases what this probe took
  return holder;
}

// What a path must be before HDF5 opens it for a run: checks that read nothing inside the file.
void check_output_kind(const std::string& path) {
  if (path.empty()) throw BadResultsFile("output path is empty");
  std::error_code ec;
  fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status)) throw BadResultsFile("output path " + path + " is a directory, not a file");
  if (fs::exists(status)) {
    if (!fs::is_regular_file(status)) throw BadResultsFile("output path " + path + " is not a regular file");
    if (!can_open_for_writing(path)) throw BadResultsFile("output file " + path + " is not writable");
    if (!h5::is_hdf5_file(path)) throw BadResultsFile("output file " + path + " exists and is not an HDF5 file");
    return;
  }
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec)) throw BadResultsFile("output folder " + parent.string() + " does not exist");
  if (!can_create_in(parent)) throw BadResultsFile("output folder " + parent.string() + " is not writable");
}

// The names of schema::kRunAttributes a run lacks (`has(name)` false), comma-separated; "" when it has them all.
template <typename Has>
std::string missing_run_attributes(Has has) {
  std::string missing;
  for (const char* name : schema::kRunAttributes)
    if (!has(name)) missing += (missing.empty() ? "" : ", ") + std::string(name);
  return missing;
}

// Opens an existing file read-only and reads it whole: a Strata file of a major version this program reads, every
// object readable, its runs group there and every run with the attributes each run has. False, with nothing
// checked, when a writer holds the file.
bool inspect_existing(const std::string& path) {
  h5::Handle file;
  try {
    file = h5::open_file(path, false);
  } catch (const ResultsError&) {
    if (lock_holder(path) == Holder::writer) return false;
    throw BadResultsFile("output file " + path + " is a damaged HDF5 file (HDF5 cannot open it; truncated?)");
  }
  try {
    check_strata_file(file, path);
    h5::walk(file);
    // Every Strata file has the group from its creation; a run cannot be appended without it.
    if (!h5::exists(file, schema::kRunsGroup))
      throw BadResultsFile("output file " + path + " is a damaged Strata file: it has no /" +
                           std::string(schema::kRunsGroup) + " group");
    const h5::Handle runs = h5::open_group(file, schema::kRunsGroup);
    for (const std::string& run_id : h5::child_names(runs)) {
      const h5::Handle run = h5::open_group(runs, run_id);
      const std::string missing = missing_run_attributes([&](const char* name) { return h5::has_attr(run, name); });
      // The scripts refuse such a file whole: a run appended to it could be read by none of them.
      if (!missing.empty())
        throw BadResultsFile("output file " + path + " is a damaged Strata file: run " + run_id +
                             " lacks the attribute(s) " + missing + " every run has");
    }
  } catch (const ResultsError& e) {
    throw BadResultsFile("output file " + path + " is a damaged HDF5 file: " + e.what());
  }
  return true;
}

std::string holder_message(const std::string& path, Holder holder) {
  return holder == Holder::readers ? path + " is in use by another program reading it (it holds the file's lock)"
                                   : in_use_message(path);
}

}  // namespace

bool held_by_writer(const std::string& path) { return lock_holder(path) == Holder::writer; }

std::string in_use_message(const std::string& path) {
  return path + " is in use by another writer (it holds the file's lock)";
}

double lock_wait_seconds() {
  const char* text = std::getenv(kLockWaitVariable);
  if (!text || !*text) return kDefaultLockWait;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (*end != '\0' || !std::isfinite(seconds) || seconds < 0)
    throw BadResultsFile(std::string(kLockWaitVariable) + "=" + text + ": expected the seconds to wait for another "
                         "writer of a results file, a number >= 0");
  return seconds;
}

void validate_output_path(const std::string& path) {
  check_output_kind(path);
  if (fs::exists(path)) inspect_existing(path);
}

std::string utc_now_iso() {
  auto now = std::chrono::system_clock::now();
  auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char buffer[64];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%S", &utc);
  char full[96];
  std::snprintf(full, sizeof full, "%s.%06lldZ", buffer, static_cast<long long>(micros));
  return full;
}

std::string new_run_id() {
  std::string iso = utc_now_iso();  // 2026-11-21T14:50:12.123456Z
  std::string compact;
  for (char c : iso)
    if (c != '-' && c != ':') compact += c;  // 20261121T145012.123456Z
  std::random_device device;
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "-%06x", device() & 0xffffffu);
  return compact + suffix;
}

ResultsWriter::ResultsWriter(const std::string& path, const std::string& run_id,
                             const std::map<std::string, std::string>& run_attrs,
                             const std::function<void(double seconds)>& on_wait)
    : path_(path), run_id_(run_id) {
  // A run lacking one of them could be read by no reader, and would make its file refused whole (inspect_existing).
  const std::string missing = missing_run_attributes(
      [&](const char* name) { return name == std::string_view("status") || run_attrs.contains(name); });
  if (!missing.empty())
    throw ResultsError("run " + run_id + " lacks the attribute(s) " + missing +
                       " every run has; nothing was written to " + path);
  if (const char* kill = std::getenv(kTestKillAfterColumns)) kill_after_columns_ = std::atoll(kill);
  const double wait = lock_wait_seconds();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                                 std::chrono::duration<double>(wait));
  bool created = false, waited = false;
  for (;;) {
    check_output_kind(path);
    Holder holder = Holder::none;
    if (!fs::exists(path)) {
      try {
        file_ = h5::create_file(path);
        created = true;
        break;
      } catch (const ResultsError&) {
        if (!fs::exists(path)) throw;
        continue;  // another writer created it first: it is an existing file now
      }
    }
    holder = lock_holder(path);
    if (holder == Holder::none && inspect_existing(path)) {
      try {
        file_ = h5::open_file(path, true);
        break;
      } catch (const ResultsError&) {
        holder = lock_holder(path);
        if (holder == Holder::none)
          throw BadResultsFile("output file " + path + " cannot be opened for writing (HDF5 refuses it)");
      }
    }
    if (holder == Holder::none) holder = Holder::writer;  // a writer took it between the probe and the open
    if (std::chrono::steady_clock::now() >= deadline) {
      char waited_text[64] = "not waiting";
      if (wait > 0) std::snprintf(waited_text, sizeof waited_text, "waited %g s for it to finish", wait);
      throw FileInUse("output file " + holder_message(path, holder) + "; " + std::string(waited_text) + " (" + kLockWaitVariable +
                      "=SECONDS sets the wait)");
    }
    if (!waited && on_wait) on_wait(wait);
    waited = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (created) {
    h5::write_attr(file_, "schema", std::string(schema::kName));
    h5::write_attr(file_, "schema_version_major", static_cast<int64_t>(schema::kVersionMajor));
    h5::write_attr(file_, "schema_version_minor", static_cast<int64_t>(schema::kVersionMinor));
    h5::write_attr(file_, "created_utc", utc_now_iso());
    h5::create_group(file_, schema::kRunsGroup);
  } else {
    // The file now holds tables of this minor version; a file of a newer minor keeps its number.
    auto major = h5::read_int_attr(file_, "schema_version_major");
    auto minor = h5::read_int_attr(file_, "schema_version_minor");
    if (major == schema::kVersionMajor && minor.value_or(0) < schema::kVersionMinor)
      h5::write_attr(file_, "schema_version_minor", static_cast<int64_t>(schema::kVersionMinor));
  }
  h5::Handle runs = h5::open_group(file_, schema::kRunsGroup);
  if (h5::exists(runs, run_id)) throw ResultsError("run " + run_id + " already exists in " + path);
  run_ = h5::create_group(runs, run_id);
  for (const auto& [name, value] : run_attrs) h5::write_attr(run_, name, value);
  h5::write_attr(run_, "status", std::string(schema::kStatusInterrupted));
  h5::write_attr(run_, "end_utc", std::string());
  flush();
}

void ResultsWriter::set_run_attr(const std::string& name, const std::string& value) { h5::write_attr(run_, name, value); }
void ResultsWriter::set_run_attr(const std::string& name, int64_t value) { h5::write_attr(run_, name, value); }

void ResultsWriter::write_env(const std::map<std::string, std::string>& env) {
  h5::Handle group = h5::exists(run_, schema::kEnvGroup) ? h5::open_group(run_, schema::kEnvGroup)
                                                        : h5::create_group(run_, schema::kEnvGroup);
  for (const auto& [name, value] : env) h5::write_attr(group, name, value);
  flush();
}

void ResultsWriter::append(const Table& rows) {
  bool fresh = !h5::exists(run_, rows.name());
  h5::Handle group = fresh ? h5::create_group(run_, rows.name()) : h5::open_group(run_, rows.name());
  // Every column exists, empty, before the first rows arrive, and `rows` is set only after the last column
  // of an append: a job killed in between leaves a table its readers cut to `rows` (SCHEMA.md, Writing).
  if (fresh) {
    for (const Column& col : rows.columns()) {
      h5::create_column(group, col.name, col.kind);
      h5::Handle dataset = h5::open_dataset(group, col.name);
      h5::write_attr(dataset, "units", col.units);
      if (!col.convention.empty()) h5::write_attr(dataset, "convention", col.convention);
    }
    for (const auto& [name, value] : rows.attrs()) h5::write_attr(group, name, value);
    h5::write_attr(group, "rows", int64_t{0});
  }
  for (const Column& col : rows.columns()) {
    if (!h5::exists(group, col.name))
      throw ResultsError("table " + rows.name() + " gained a column after its first rows: " + col.name);
    if (col.kind == ColumnKind::int64) h5::append_column(group, col.name, col.ints);
    if (col.kind == ColumnKind::float64) h5::append_column(group, col.name, col.reals);
    if (col.kind == ColumnKind::string) h5::append_column(group, col.name, col.texts);
    after_column_append();
  }
  h5::write_attr(group, "rows", static_cast<int64_t>(h5::column_length(group, rows.columns().front().name)));
}

void ResultsWriter::after_column_append() {
  if (kill_after_columns_ <= 0 || ++columns_appended_ < kill_after_columns_) return;
  // The state on disk is then exactly "N columns appended", what a kill between appends leaves once
  // HDF5's cache has reached the disk; without the flush the test would depend on cache eviction.
  flush();
  std::raise(SIGKILL);
}

void ResultsWriter::flush() { h5::flush(file_); }

void ResultsWriter::finish(const std::string& status) {
  h5::write_attr(run_, "status", status);
  h5::write_attr(run_, "end_utc", utc_now_iso());
  flush();
}

}  // namespace strata
