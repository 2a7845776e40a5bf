// strata-test-read-table FILE RUN TABLE: one table as the C++ reader (results/reader.h) returns it, as JSON
// {"rows": N, "columns": {"name": {"units": ..., "values": [...]}}}, so tests can hold the C++ reader and
// the Python reader to the same file. Exit 2 when the file or table cannot be read.
#include <cstdio>
#include <exception>

#include <nlohmann/json.hpp>

#include "results/reader.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: strata-test-read-table FILE RUN TABLE\n");
    return 2;
  }
  try {
    strata::h5::silence_library_errors();
    strata::ResultsReader reader(argv[1]);
    strata::Table table = reader.table(argv[2], argv[3]);
    nlohmann::ordered_json out;
    out["schema_version"] = reader.schema_version();
    out["rows"] = table.rows();
    out["columns"] = nlohmann::ordered_json::object();
    for (const strata::Column& col : table.columns()) {
      nlohmann::ordered_json values = nlohmann::ordered_json::array();
      if (col.kind == strata::ColumnKind::int64) values = col.ints;
      if (col.kind == strata::ColumnKind::float64) values = col.reals;
      if (col.kind == strata::ColumnKind::string) values = col.texts;
      out["columns"][col.name] = {{"units", col.units}, {"values", values}};
    }
    std::printf("%s\n", out.dump().c_str());
    return 0;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "strata-test-read-table: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata-test-read-table: error: %s\n", e.what());
    return 1;
  }
}
