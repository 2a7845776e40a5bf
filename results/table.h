// A results table held in memory as named, typed columns, each with its unit and convention: the shape
// every Strata table has on disk (one 1-D HDF5 dataset per column). Benchmarks fill rows; the writer appends
// them; the reader returns them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "results/error.h"
#include "results/h5.h"

namespace strata {

using h5::ColumnKind;

struct Column {
  std::string name;
  ColumnKind kind = ColumnKind::float64;
  std::string units;       // SI unit ("s", "B", "B/s", "FLOP", "FLOP/s"), "1" for counts and ratios, "" for labels
  std::string convention;  // how the value was derived, for derived metrics; empty otherwise
  std::vector<int64_t> ints;
  std::vector<double> reals;
  std::vector<std::string> texts;

  size_t size() const {
    return kind == ColumnKind::int64 ? ints.size() : kind == ColumnKind::float64 ? reals.size() : texts.size();
  }
};

class Table {
 public:
  explicit Table(std::string name = "") : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  Table& add_column(std::string name, ColumnKind kind, std::string units, std::string convention = "") {
    if (has_column(name)) throw ResultsError("table " + name_ + ": column declared twice: " + name);
    columns_.push_back(Column{std::move(name), kind, std::move(units), std::move(convention), {}, {}, {}});
    return *this;
  }
  bool has_column(std::string_view name) const { return find(name) != nullptr; }
  const Column& column(std::string_view name) const {
    const Column* found = find(name);
    if (!found) throw ResultsError("table " + name_ + " has no column " + std::string(name));
    return *found;
  }
  Column& column(std::string_view name) { return const_cast<Column&>(std::as_const(*this).column(name)); }
  const std::vector<Column>& columns() const { return columns_; }
  std::vector<Column>& columns() { return columns_; }

  // Row building: set every column once, then end_row().
  Table& set(std::string_view name, int64_t value) { return push(name, ColumnKind::int64).ints.push_back(value), *this; }
  Table& set(std::string_view name, int value) { return set(name, static_cast<int64_t>(value)); }
  Table& set(std::string_view name, size_t value) { return set(name, static_cast<int64_t>(value)); }
  Table& set(std::string_view name, double value) { return push(name, ColumnKind::float64).reals.push_back(value), *this; }
  Table& set(std::string_view name, std::string value) {
    return push(name, ColumnKind::string).texts.push_back(std::move(value)), *this;
  }
  Table& set(std::string_view name, const char* value) { return set(name, std::string(value)); }
  void end_row() {
    ++rows_;
    for (const auto& col : columns_)
      if (col.size() != rows_) throw ResultsError("table " + name_ + ": column " + col.name + " not set in row " + std::to_string(rows_ - 1));
  }
  size_t rows() const { return rows_; }
  void clear_rows() {
    for (auto& col : columns_) col.ints.clear(), col.reals.clear(), col.texts.clear();
    rows_ = 0;
  }
  // Attributes of the table group, written when the table is created (e.g. `sorted_by`).
  Table& set_attr(std::string name, std::string value) {
    attrs_[std::move(name)] = std::move(value);
    return *this;
  }
  const std::map<std::string, std::string>& attrs() const { return attrs_; }
  // For the reader: a table loaded whole.
  void set_rows(size_t rows) { rows_ = rows; }

 private:
  const Column* find(std::string_view name) const {
    for (const auto& col : columns_)
      if (col.name == name) return &col;
    return nullptr;
  }
  Column& push(std::string_view name, ColumnKind kind) {
    Column& col = column(name);
    if (col.kind != kind) throw ResultsError("table " + name_ + ": column " + col.name + " set with the wrong type");
    if (col.size() != rows_) throw ResultsError("table " + name_ + ": column " + col.name + " set twice in one row");
    return col;
  }

  std::string name_;
  std::vector<Column> columns_;
  std::map<std::string, std::string> attrs_;
  size_t rows_ = 0;
};

}  // namespace strata
