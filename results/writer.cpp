// Implementation of the results writer (see writer.h).
#include "results/writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <random>

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

void validate_output_path(const std::string& path) {
  if (path.empty()) throw BadResultsFile("output path is empty");
  std::error_code ec;
  fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status)) throw BadResultsFile("output path " + path + " is a directory, not a file");
  if (fs::exists(status)) {
    if (!fs::is_regular_file(status)) throw BadResultsFile("output path " + path + " is not a regular file");
    if (!can_open_for_writing(path)) throw BadResultsFile("output file " + path + " is not writable");
    if (!h5::is_hdf5_file(path)) throw BadResultsFile("output file " + path + " exists and is not an HDF5 file");
    // A truncated or otherwise damaged file still carries the HDF5 signature; opening it read-only tells.
    h5::Handle file;
    try {
      file = h5::open_file(path, false);
    } catch (const ResultsError&) {
      throw BadResultsFile("output file " + path + " is a damaged HDF5 file (HDF5 cannot open it; truncated?)");
    }
    check_strata_file(file, path);
    return;
  }
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec)) throw BadResultsFile("output folder " + parent.string() + " does not exist");
  if (!can_create_in(parent)) throw BadResultsFile("output folder " + parent.string() + " is not writable");
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
                             const std::map<std::string, std::string>& run_attrs)
    : path_(path), run_id_(run_id) {
  if (const char* kill = std::getenv(kTestKillAfterColumns)) kill_after_columns_ = std::atoll(kill);
  validate_output_path(path);
  if (fs::exists(path)) {
    file_ = h5::open_file(path, true);
    // The file now holds tables of this minor version; a file of a newer minor keeps its number.
    auto major = h5::read_int_attr(file_, "schema_version_major");
    auto minor = h5::read_int_attr(file_, "schema_version_minor");
    if (major == schema::kVersionMajor && minor.value_or(0) < schema::kVersionMinor)
      h5::write_attr(file_, "schema_version_minor", static_cast<int64_t>(schema::kVersionMinor));
  } else {
    file_ = h5::create_file(path);
    h5::write_attr(file_, "schema", std::string(schema::kName));
    h5::write_attr(file_, "schema_version_major", static_cast<int64_t>(schema::kVersionMajor));
    h5::write_attr(file_, "schema_version_minor", static_cast<int64_t>(schema::kVersionMinor));
    h5::write_attr(file_, "created_utc", utc_now_iso());
    h5::create_group(file_, schema::kRunsGroup);
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
