// Parameter axes as data, as nvbench has them: a benchmark names its axes and their values once; the harness
// runs their product, declares one `cases` column per axis (with its unit) and fills it for every case, so no
// program writes nested loops or a column name twice.
//
//   Axes axes;
//   axes.add("dtype", {"fp32", "fp64"}).add("size", {256, 512, 1024}, "1");
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

class Axes {
 public:
  Axes& add(std::string name, std::vector<int64_t> values, std::string units = "1");
  Axes& add(std::string name, std::vector<double> values, std::string units);
  Axes& add(std::string name, std::vector<std::string> values);
  // Every combination, the last axis varying fastest. Empty when any axis has no value.
  std::vector<AxisPoint> product() const;
  std::size_t size() const;
  void declare_columns(Table& cases) const;
  void fill(Table& row, const AxisPoint& point) const;

 private:
  struct Axis {
    std::string name;
    std::string units;
    std::vector<AxisValue> values;
  };
  Axes& add_axis(std::string name, std::string units, std::vector<AxisValue> values);
  std::vector<Axis> axes_;
};

}  // namespace strata
