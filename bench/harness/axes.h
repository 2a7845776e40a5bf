// Parameter axes as data, as nvbench has them: a benchmark names its axes and their values once; the harness
// runs their product, declares one `cases` column per axis (with its unit) and fills it for every case, so no
// program writes nested loops or a column name twice.
//
//   Axes axes;
//   axes.add("dtype", {"fp32", "fp64"}).add("size", {256, 512, 1024}, "1");
//   axes.add_zipped({{"m", "1"}, {"n", "1"}}, {{64, 32}, {128, 96}});  // columns that step together
//   axes.declare_columns(run.cases());
//   for (const AxisPoint& point : axes.product()) { ... point.text("dtype") ... point.integer("size") ... }
//   ... fill_case: axes.fill(row, point);
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "results/table.h"

namespace strata {

using AxisValue = std::variant<int64_t, double, std::string>;

// One combination of axis values, in axis order.
class AxisPoint {
 public:
  int64_t integer(const std::string& axis) const;
  double real(const std::string& axis) const;
  const std::string& text(const std::string& axis) const;
  // "dtype=fp32 size=256": a case label.
  std::string label() const;

 private:
  friend class Axes;
  const AxisValue& value(const std::string& axis) const;
  std::vector<std::pair<std::string, AxisValue>> values_;
};

// One column of an axis: its name, units and the convention stored beside them (what the values mean).
struct AxisColumn {
  std::string name;
  std::string units;
  std::string convention = "parameter axis";
};

class Axes {
 public:
  // A run's constant (the model's width, the grid) is an axis of one value: its column is declared and filled
  // with the rest.
  Axes& add(std::string name, std::vector<int64_t> values, std::string units = "1",
            std::string convention = "parameter axis");
  Axes& add(std::string name, std::vector<double> values, std::string units, std::string convention = "parameter axis");
  Axes& add(std::string name, std::vector<std::string> values, std::string convention = "parameter axis");
  // Several columns that step together as one axis: each tuple holds one value per column (a column's kind is
  // that of its value in the first tuple; every tuple must match it). For values that are not independent,
  // such as the M, N, K of a list of shapes.
  Axes& add_zipped(std::vector<AxisColumn> columns, std::vector<std::vector<AxisValue>> tuples);
  // Every combination, the last axis varying fastest. Empty when any axis has no value.
  std::vector<AxisPoint> product() const;
  std::size_t size() const;
  void declare_columns(Table& cases) const;
  void fill(Table& row, const AxisPoint& point) const;

 private:
  struct Axis {
    std::vector<AxisColumn> columns;
    std::vector<std::vector<AxisValue>> steps;  // one value per column in each
  };
  Axes& add_axis(AxisColumn column, std::vector<AxisValue> values);
  std::vector<Axis> axes_;
};

}  // namespace strata
