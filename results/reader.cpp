// Implementation of the results reader (see reader.h).
#include "results/reader.h"

#include <algorithm>
#include <cstdint>

#include "results/schema.h"
#include "results/writer.h"

namespace strata {

template <typename Read>
auto ResultsReader::guarded(Read&& read) const -> decltype(read()) {
  try {
    return read();
  } catch (const ResultsError& e) {
    throw BadResultsFile(path_ + " is a damaged HDF5 file: " + e.what());
  }
}

ResultsReader::ResultsReader(const std::string& path) : path_(path) {
  if (path.empty()) throw BadResultsFile("an empty file name where a Strata results file is needed");
  if (!h5::is_hdf5_file(path)) throw BadResultsFile(path + " is not an HDF5 file (or does not exist)");
  try {
    file_ = h5::open_file(path, false);
  } catch (const ResultsError&) {
    if (held_by_writer(path)) throw BadResultsFile(in_use_message(path) + ": read it when the writer has finished");
    throw BadResultsFile(path + " is a damaged HDF5 file (HDF5 cannot open it; truncated?)");
  }
  version_ = guarded([&] { return check_strata_file(file_, path); });
  // Read whole once, so damage anywhere is named here rather than found, or missed, by whatever is read later.
  guarded([&] { h5::walk(file_); });
}

std::vector<std::string> ResultsReader::runs() const {
  return guarded([&]() -> std::vector<std::string> {
    if (!h5::exists(file_, schema::kRunsGroup)) return {};
    return h5::child_names(h5::open_group(file_, schema::kRunsGroup));
  });
}

h5::Handle ResultsReader::run(const std::string& run_id) const {
  h5::Handle runs = h5::open_group(file_, schema::kRunsGroup);
  if (!h5::exists(runs, run_id)) throw BadResultsFile(path_ + " has no run " + run_id);
  return h5::open_group(runs, run_id);
}

namespace {
std::map<std::string, std::string> all_attrs(const h5::Handle& object) {
  std::map<std::string, std::string> attrs;
  for (const auto& name : h5::attr_names(object)) attrs[name] = h5::read_attr_as_string(object, name);
  return attrs;
}
}  // namespace

std::map<std::string, std::string> ResultsReader::run_attrs(const std::string& run_id) const {
  return guarded([&] { return all_attrs(run(run_id)); });
}

std::map<std::string, std::string> ResultsReader::env(const std::string& run_id) const {
  return guarded([&]() -> std::map<std::string, std::string> {
    h5::Handle group = run(run_id);
    if (!h5::exists(group, schema::kEnvGroup)) return {};
    return all_attrs(h5::open_group(group, schema::kEnvGroup));
  });
}

std::vector<std::string> ResultsReader::tables(const std::string& run_id) const {
  return guarded([&] {
    std::vector<std::string> names;
    h5::Handle group = run(run_id);
    for (const auto& name : h5::child_names(group))
      if (name != schema::kEnvGroup) names.push_back(name);
    return names;
  });
}

Table ResultsReader::table(const std::string& run_id, const std::string& name) const {
  return guarded([&] { return read_table(run_id, name); });
}

Table ResultsReader::read_table(const std::string& run_id, const std::string& name) const {
  h5::Handle group = run(run_id);
  if (!h5::exists(group, name)) throw BadResultsFile("run " + run_id + " has no table " + name);
  h5::Handle table_group = h5::open_group(group, name);
  std::vector<std::string> names = h5::child_names(table_group);
  // A job killed between two column appends leaves some columns longer than others: the table holds the
  // rows every column has. The writer sets `rows` after the last column of an append, so it is that length.
  size_t rows = SIZE_MAX;
  for (const auto& col_name : names) rows = std::min(rows, h5::column_length(table_group, col_name));
  if (names.empty()) rows = 0;
  if (auto recorded = h5::read_int_attr(table_group, "rows"))
    rows = std::min(rows, static_cast<size_t>(std::max<int64_t>(*recorded, 0)));
  Table table(name);
  for (const auto& col_name : names) {
    h5::Handle dataset = h5::open_dataset(table_group, col_name);
    ColumnKind kind = h5::column_kind(table_group, col_name);
    table.add_column(col_name, kind, h5::read_string_attr(dataset, "units").value_or(""),
                     h5::read_string_attr(dataset, "convention").value_or(""));
    Column& col = table.column(col_name);
    if (kind == ColumnKind::int64) col.ints = h5::read_int_column(table_group, col_name, rows);
    if (kind == ColumnKind::float64) col.reals = h5::read_double_column(table_group, col_name, rows);
    if (kind == ColumnKind::string) col.texts = h5::read_string_column(table_group, col_name, rows);
  }
  table.set_rows(rows);
  return table;
}

}  // namespace strata
