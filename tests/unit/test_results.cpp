// Unit tests of the results schema: a table round trip through the writer and reader, appending a run
// without touching earlier ones, and the refusals (not HDF5, not Strata, newer major, bad paths).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>

#include "results/h5.h"
#include "results/reader.h"
#include "results/schema.h"
#include "results/writer.h"

using namespace strata;
namespace fs = std::filesystem;

namespace {
// What every run has from its start (the harness's and strata-project's writers set them; the writer adds status).
std::map<std::string, std::string> run_attrs() {
  return {{"benchmark", "unit"}, {"n_ranks", "1"}, {"n_nodes", "1"}, {"launcher", "none"},
          {"start_utc", "2026-01-01T00:00:00Z"}};
}

struct TempDir {
  fs::path path;
  TempDir() {
    char pattern[] = "/tmp/strata-test-XXXXXX";
    path = mkdtemp(pattern);
    h5::silence_library_errors();
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Table sample_table() {
  Table t("summary");
  t.add_column("case", ColumnKind::int64, "1");
  t.add_column("time", ColumnKind::float64, "s", "median of max over ranks");
  t.add_column("label", ColumnKind::string, "");
  for (int i = 0; i < 3; ++i) {
    t.set("case", i).set("time", 0.5 * i).set("label", "case-" + std::to_string(i) + " \xce\xbc");
    t.end_row();
  }
  return t;
}
}  // namespace

TEST(Results, TableRoundTrip) {
  TempDir dir;
  std::string path = dir.file("r.h5");
  {
    ResultsWriter w(path, "run-a", run_attrs());
    w.write_env({{"mpi_library", "test"}});
    Table t = sample_table();
    w.append(t);
    w.append(t);  // appends rows, keeps units
    w.finish(schema::kStatusOk);
  }
  ResultsReader r(path);
  EXPECT_EQ(r.schema_version(), "1.1");
  ASSERT_EQ(r.runs(), std::vector<std::string>{"run-a"});
  auto attrs = r.run_attrs("run-a");
  EXPECT_EQ(attrs["benchmark"], "unit");
  EXPECT_EQ(attrs["status"], "ok");
  EXPECT_FALSE(attrs["end_utc"].empty());
  EXPECT_EQ(r.env("run-a")["mpi_library"], "test");
  Table t = r.table("run-a", "summary");
  EXPECT_EQ(t.rows(), 6u);
  EXPECT_EQ(t.column("time").units, "s");
  EXPECT_EQ(t.column("time").convention, "median of max over ranks");
  EXPECT_EQ(t.column("case").ints, (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_DOUBLE_EQ(t.column("time").reals[2], 1.0);
  EXPECT_EQ(t.column("label").texts[1], "case-1 \xce\xbc");
  // Column order is the order written.
  EXPECT_EQ(t.columns()[0].name, "case");
  EXPECT_EQ(t.columns()[2].name, "label");
}

TEST(Results, AppendingARunLeavesEarlierRunsIntact) {
  TempDir dir;
  std::string path = dir.file("r.h5");
  {
    ResultsWriter w(path, "run-1", run_attrs());
    w.append(sample_table());
    w.finish(schema::kStatusOk);
  }
  Table before = ResultsReader(path).table("run-1", "summary");
  {
    ResultsWriter w(path, "run-2", run_attrs());
    w.append(sample_table());
    // not finished: stays "interrupted"
  }
  {
    ResultsReader r(path);
    EXPECT_EQ(r.runs(), (std::vector<std::string>{"run-1", "run-2"}));
    EXPECT_EQ(r.run_attrs("run-1")["status"], "ok");
    EXPECT_EQ(r.run_attrs("run-2")["status"], "interrupted");
    Table after = r.table("run-1", "summary");
    EXPECT_EQ(after.column("time").reals, before.column("time").reals);
  }
  EXPECT_THROW(ResultsWriter(path, "run-1", run_attrs()), std::runtime_error);  // run ids are never reused
}

TEST(Results, RefusesToAppendToAFileWithARunLackingItsAttributes) {
  TempDir dir;
  const std::string path = dir.file("r.h5");
  {  // as a program of a broken build could have left it: the writer itself refuses such a run (below)
    { ResultsWriter w(path, "bare", run_attrs()); }
    h5::Handle file = h5::open_file(path, true);
    h5::Handle run = h5::open_group(h5::open_group(file, schema::kRunsGroup), "bare");
    for (const char* name : {"n_ranks", "n_nodes", "launcher", "start_utc"}) STRATA_H5_CHECK(H5Adelete(run.get(), name));
  }
  const std::string before = read_bytes(path);
  try {
    ResultsWriter w(path, "run-2", run_attrs());
    ADD_FAILURE() << "appended to a file whose run lacks n_ranks";
  } catch (const BadResultsFile& e) {
    EXPECT_NE(std::string(e.what()).find("run bare lacks the attribute(s) n_ranks, n_nodes, launcher, start_utc"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(read_bytes(path), before);
}

TEST(Results, RefusesToWriteARunLackingItsAttributes) {
  TempDir dir;
  const std::string path = dir.file("r.h5");
  try {
    ResultsWriter w(path, "bare", {{"benchmark", "unit"}, {"n_nodes", "1"}});
    ADD_FAILURE() << "wrote a run lacking n_ranks";
  } catch (const ResultsError& e) {
    EXPECT_NE(std::string(e.what()).find("run bare lacks the attribute(s) n_ranks, launcher, start_utc every run has; "
                                         "nothing was written to " + path),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(path));
}

TEST(Results, RefusesFilesItMustNotTouch) {
  TempDir dir;
  std::string text = dir.file("notes.txt");
  std::ofstream(text) << "not hdf5";
  std::string text_before = read_bytes(text);
  EXPECT_THROW(validate_output_path(text), std::invalid_argument);
  EXPECT_THROW(ResultsReader{text}, std::invalid_argument);
  EXPECT_EQ(read_bytes(text), text_before);

  std::string foreign = dir.file("foreign.h5");
  { h5::Handle f = h5::create_file(foreign); h5::write_attr(f, "schema", std::string("other")); }
  std::string foreign_before = read_bytes(foreign);
  try {
    validate_output_path(foreign);
    FAIL() << "accepted a non-Strata HDF5 file";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("not a Strata results file"), std::string::npos);
  }
  EXPECT_EQ(read_bytes(foreign), foreign_before);

  std::string newer = dir.file("newer.h5");
  {
    h5::Handle f = h5::create_file(newer);
    h5::write_attr(f, "schema", std::string(schema::kName));
    h5::write_attr(f, "schema_version_major", int64_t{schema::kVersionMajor + 1});
    h5::write_attr(f, "schema_version_minor", int64_t{0});
  }
  std::string newer_before = read_bytes(newer);
  try {
    ResultsReader r(newer);
    FAIL() << "read a newer major version";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("newer than this program"), std::string::npos);
  }
  EXPECT_THROW(ResultsWriter(newer, "x", run_attrs()), std::invalid_argument);
  EXPECT_EQ(read_bytes(newer), newer_before);

  EXPECT_THROW(validate_output_path(dir.path.string()), std::invalid_argument);                  // a directory
  EXPECT_THROW(validate_output_path(dir.file("missing/dir/r.h5")), std::invalid_argument);       // no such folder
  EXPECT_THROW(validate_output_path(""), std::invalid_argument);
}

TEST(Results, RunIdsSortByTime) {
  std::string a = new_run_id();
  usleep(2000);
  std::string b = new_run_id();
  EXPECT_LT(a, b);
  EXPECT_EQ(a.size(), b.size());
}

// A job killed between two column appends leaves columns of different lengths: the reader returns the rows
// of the last complete append, by the `rows` attribute, or by the shortest column where it is missing.
TEST(Results, ReaderCutsColumnsToTheRowsOfTheLastCompleteAppend) {
  TempDir dir;
  std::string path = dir.file("r.h5");
  std::string run_id = "run-cut";
  {
    ResultsWriter w(path, run_id, run_attrs());
    w.append(sample_table());
  }
  {
    // What the writer leaves when it dies after appending one column of a second append.
    h5::Handle file = h5::open_file(path, true);
    h5::Handle table = h5::open_group(h5::open_group(h5::open_group(file, schema::kRunsGroup), run_id), "summary");
    h5::append_column(table, "case", std::vector<int64_t>{7, 8});
  }
  Table cut = ResultsReader(path).table(run_id, "summary");
  EXPECT_EQ(cut.rows(), 3u);
  EXPECT_EQ(cut.column("case").ints, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(cut.column("label").texts.size(), 3u);
  {
    h5::Handle file = h5::open_file(path, true);
    h5::Handle table = h5::open_group(h5::open_group(h5::open_group(file, schema::kRunsGroup), run_id), "summary");
    h5::append_column(table, "time", std::vector<double>{7.5});
    STRATA_H5_CHECK(H5Adelete(table.get(), "rows"));  // as a writer older than this reader may leave it
  }
  Table shortest = ResultsReader(path).table(run_id, "summary");
  EXPECT_EQ(shortest.rows(), 3u);  // label is still 3 long
  EXPECT_EQ(shortest.column("time").reals.size(), 3u);
  EXPECT_EQ(shortest.column("case").ints.size(), 3u);
}

// Columns grow by chunks of 256 rows; past 64 chunks HDF5 splits a column's chunk index. A table that has crossed
// it, appended in pieces that straddle chunk edges, reads back every value, and an append cut after one column
// still leaves the rows before it.
TEST(Results, ColumnsPastManyChunksReadBackAndSurviveACutAppend) {
  TempDir dir;
  std::string path = dir.file("r.h5");
  std::string run_id = "run-long";
  constexpr int kAppends = 70, kRowsPerAppend = 301;  // 21,070 rows: 83 chunks, no append on a chunk edge
  {
    ResultsWriter w(path, run_id, run_attrs());
    for (int a = 0; a < kAppends; ++a) {
      Table t("samples");
      t.add_column("case", ColumnKind::int64, "1");
      t.add_column("time", ColumnKind::float64, "s");
      t.add_column("label", ColumnKind::string, "");
      for (int i = 0; i < kRowsPerAppend; ++i) {
        const int row = a * kRowsPerAppend + i;
        t.set("case", row).set("time", 0.25 * row).set("label", "r" + std::to_string(row));
        t.end_row();
      }
      w.append(t);
    }
  }
  {
    h5::Handle file = h5::open_file(path, true);
    h5::Handle table = h5::open_group(h5::open_group(h5::open_group(file, schema::kRunsGroup), run_id), "samples");
    h5::append_column(table, "case", std::vector<int64_t>(kRowsPerAppend, -1));
  }
  Table t = ResultsReader(path).table(run_id, "samples");
  constexpr std::size_t kRows = std::size_t{kAppends} * kRowsPerAppend;
  ASSERT_EQ(t.rows(), kRows);
  const auto& cases = t.column("case").ints;
  const auto& times = t.column("time").reals;
  const auto& labels = t.column("label").texts;
  ASSERT_EQ(cases.size(), kRows);
  ASSERT_EQ(times.size(), kRows);
  ASSERT_EQ(labels.size(), kRows);
  std::size_t wrong = 0;
  for (std::size_t row = 0; row < kRows; ++row)
    wrong += cases[row] != static_cast<int64_t>(row) || times[row] != 0.25 * static_cast<double>(row) ||
             labels[row] != "r" + std::to_string(row);
  EXPECT_EQ(wrong, 0u);
}

// A job killed after the last column of an append but before the `rows` attribute leaves every column equally
// long and longer than `rows`: the columns agree, yet the rows past `rows` belong to an append that did not end.
TEST(Results, ReaderTakesTheRowsAttributeOverColumnsThatAgree) {
  TempDir dir;
  std::string path = dir.file("r.h5");
  std::string run_id = "run-unfinished";
  {
    ResultsWriter w(path, run_id, run_attrs());
    w.append(sample_table());
  }
  {
    h5::Handle file = h5::open_file(path, true);
    h5::Handle table = h5::open_group(h5::open_group(h5::open_group(file, schema::kRunsGroup), run_id), "summary");
    h5::append_column(table, "case", std::vector<int64_t>{7, 8});
    h5::append_column(table, "time", std::vector<double>{7.5, 8.5});
    h5::append_column(table, "label", std::vector<std::string>{"case-7", "case-8"});
    for (const char* column : {"case", "time", "label"}) ASSERT_EQ(h5::column_length(table, column), 5u) << column;
    ASSERT_EQ(h5::read_int_attr(table, "rows"), std::optional<int64_t>{3});
  }
  Table table = ResultsReader(path).table(run_id, "summary");
  EXPECT_EQ(table.rows(), 3u);
  EXPECT_EQ(table.column("case").ints, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(table.column("time").reals, (std::vector<double>{0.0, 0.5, 1.0}));
  ASSERT_EQ(table.column("label").texts.size(), 3u);
  EXPECT_EQ(table.column("label").texts.back(), "case-2 \xce\xbc");
}

// A truncated HDF5 file keeps its signature but cannot be opened: a usage error, the file untouched.
TEST(Results, RefusesATruncatedFileWithoutTouchingIt) {
  TempDir dir;
  std::string path = dir.file("cut.h5");
  {
    ResultsWriter w(path, "run-1", run_attrs());
    w.append(sample_table());
    w.finish(schema::kStatusOk);
  }
  std::string bytes = read_bytes(path);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  std::string before = read_bytes(path);
  ASSERT_TRUE(h5::is_hdf5_file(path));
  EXPECT_THROW(validate_output_path(path), std::invalid_argument);
  EXPECT_THROW(ResultsReader{path}, std::invalid_argument);
  EXPECT_THROW(ResultsWriter(path, "run-2", run_attrs()), std::invalid_argument);
  EXPECT_EQ(read_bytes(path), before);
}

// Damage inside a file, where opening it does not look (the chunk index of a column in its second half): the writer
// refuses to append and the reader to read, each naming the file as damaged, and the file is left as it was.
TEST(Results, RefusesAFileDamagedInsideWithoutTouchingIt) {
  TempDir dir;
  std::string path = dir.file("damaged.h5");
  {
    ResultsWriter w(path, "run-1", run_attrs());
    w.append(sample_table());
    w.finish(schema::kStatusOk);
  }
  std::string bytes = read_bytes(path);
  const size_t index = bytes.rfind("TREE");
  ASSERT_NE(index, std::string::npos);
  ASSERT_GT(index, bytes.size() / 2);
  for (size_t i = index; i < index + 8; ++i) bytes[i] = static_cast<char>(~bytes[i]);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  const std::string before = read_bytes(path);
  h5::Handle file = h5::open_file(path, false);  // the damage is inside: the file opens
  EXPECT_THROW(h5::walk(file), ResultsError);
  file = h5::Handle();
  auto expect_damaged = [&](auto&& call) {
    try {
      call();
      ADD_FAILURE() << "no error for the damaged file";
    } catch (const BadResultsFile& e) {
      EXPECT_NE(std::string(e.what()).find(path + " is a damaged HDF5 file"), std::string::npos) << e.what();
    }
  };
  expect_damaged([&] { validate_output_path(path); });
  expect_damaged([&] { ResultsWriter(path, "run-2", run_attrs()); });
  expect_damaged([&] {
    ResultsReader reader(path);
    for (const auto& run : reader.runs())
      for (const auto& table : reader.tables(run)) reader.table(run, table);
  });
  EXPECT_EQ(read_bytes(path), before);
}

// A second writer of a file another writer holds (HDF5's lock) waits STRATA_LOCK_WAIT seconds, then refuses with
// FileInUse; once the first closes, the second appends. A malformed wait is refused.
TEST(Results, ASecondWriterWaitsForTheFirstThenRefusesOrAppends) {
  TempDir dir;
  std::string path = dir.file("shared.h5");
  ASSERT_EQ(setenv(kLockWaitVariable, "0.3", 1), 0);
  {
    ResultsWriter first(path, "run-1", run_attrs());
    first.append(sample_table());
    first.flush();
    EXPECT_TRUE(held_by_writer(path));
    bool told = false;
    const auto start = std::chrono::steady_clock::now();
    try {
      ResultsWriter second(path, "run-2", run_attrs(), [&](double seconds) { told = seconds == 0.3; });
      ADD_FAILURE() << "the second writer did not wait for the first";
    } catch (const FileInUse& e) {
      EXPECT_NE(std::string(e.what()).find("in use by another writer"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(told);
    EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.3);
    first.finish(schema::kStatusOk);
  }
  EXPECT_FALSE(held_by_writer(path));
  {
    ResultsWriter second(path, "run-2", run_attrs());
    second.finish(schema::kStatusOk);
  }
  EXPECT_EQ(ResultsReader(path).runs().size(), 2u);
  ASSERT_EQ(setenv(kLockWaitVariable, "soon", 1), 0);
  EXPECT_THROW(ResultsWriter(path, "run-3", run_attrs()), BadResultsFile);
  ASSERT_EQ(unsetenv(kLockWaitVariable), 0);
}

// Schema 1.1 only adds tables: a 1.0 file still reads, and appending a run to it raises its minor version.
TEST(Results, ReadsAndExtendsAVersion10File) {
  TempDir dir;
  std::string path = dir.file("old.h5");
  {
    ResultsWriter w(path, "run-old", run_attrs());
    w.append(sample_table());
    w.finish(schema::kStatusOk);
  }
  { h5::write_attr(h5::open_file(path, true), "schema_version_minor", int64_t{0}); }
  {
    ResultsReader old(path);
    EXPECT_EQ(old.schema_version(), "1.0");
    EXPECT_EQ(old.table("run-old", "summary").rows(), 3u);
  }
  { ResultsWriter w(path, "run-new", run_attrs()); }
  EXPECT_EQ(ResultsReader(path).schema_version(), "1." + std::to_string(schema::kVersionMinor));
  EXPECT_EQ(ResultsReader(path).table("run-old", "summary").rows(), 3u);
}

TEST(Results, OpenGroupNamesWhatStandsWhereTheGroupBelongs) {
  TempDir dir;
  const std::string path = dir.file("links.h5");
  h5::Handle file = h5::create_file(path);
  h5::create_group(file, "runs");
  ASSERT_GE(H5Lcreate_soft("/nowhere", file.get(), "dangling", H5P_DEFAULT, H5P_DEFAULT), 0);
  const hsize_t three = 3;
  h5::Handle space(H5Screate_simple(1, &three, nullptr), H5Sclose);
  h5::Handle data(H5Dcreate2(file.get(), "table", H5T_NATIVE_INT64, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                  H5Dclose);
  ASSERT_GE(data.get(), 0);
  EXPECT_NO_THROW(h5::open_group(file, "runs"));
  auto message = [&](const std::string& name) {
    try {
      h5::open_group(file, name);
    } catch (const ResultsError& e) {
      return std::string(e.what());
    }
    return std::string("opened");
  };
  EXPECT_EQ(message("missing"), "HDF5 group not found: missing");
  EXPECT_EQ(message("table"), "HDF5 object table is not a group");
  EXPECT_EQ(message("dangling"), "cannot open HDF5 object dangling (a link to nothing, or a damaged object header)");
}
