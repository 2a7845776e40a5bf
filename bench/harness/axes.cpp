// Implementation of parameter axes (see axes.h).
#include "bench/harness/axes.h"

#include <stdexcept>

namespace strata {

namespace {

std::string to_text(const AxisValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) {
    std::string text = std::to_string(*d);
    while (text.size() > 1 && text.back() == '0') text.pop_back();
    if (!text.empty() && text.back() == '.') text.pop_back();
    return text;
  }
  return std::get<std::string>(v);
}

}  // namespace

const AxisValue& AxisPoint::value(const std::string& axis) const {
  for (const auto& [name, v] : values_)
    if (name == axis) return v;
  throw std::invalid_argument("no axis named " + axis);
}

int64_t AxisPoint::integer(const std::string& axis) const {
  const auto* v = std::get_if<int64_t>(&value(axis));
  if (!v) throw std::invalid_argument("axis " + axis + " does not hold integers");
  return *v;
}

double AxisPoint::real(const std::string& axis) const {
  const auto* v = std::get_if<double>(&value(axis));
  if (!v) throw std::invalid_argument("axis " + axis + " does not hold reals");
  return *v;
}

const std::string& AxisPoint::text(const std::string& axis) const {
  const auto* v = std::get_if<std::string>(&value(axis));
  if (!v) throw std::invalid_argument("axis " + axis + " does not hold text");
  return *v;
}

std::string AxisPoint::label() const {
  std::string label;
  for (const auto& [name, v] : values_) label += (label.empty() ? "" : " ") + name + "=" + to_text(v);
  return label;
}

Axes& Axes::add_axis(AxisColumn column, std::vector<AxisValue> values) {
  std::vector<std::vector<AxisValue>> steps;
  for (AxisValue& v : values) steps.push_back({std::move(v)});
  return add_zipped({std::move(column)}, std::move(steps));
}

Axes& Axes::add_zipped(std::vector<AxisColumn> columns, std::vector<std::vector<AxisValue>> tuples) {
  for (const AxisColumn& c : columns)
    for (const Axis& a : axes_)
      for (const AxisColumn& other : a.columns)
        if (other.name == c.name) throw std::invalid_argument("axis " + c.name + " declared twice");
  for (const auto& tuple : tuples) {
    if (tuple.size() != columns.size())
      throw std::invalid_argument("axis " + columns.front().name + ": a tuple of " + std::to_string(tuple.size()) +
                                  " values for " + std::to_string(columns.size()) + " columns");
    for (std::size_t c = 0; c < columns.size(); ++c)
      if (tuple[c].index() != tuples.front()[c].index())
        throw std::invalid_argument("axis " + columns[c].name + " mixes value kinds");
  }
  axes_.push_back({std::move(columns), std::move(tuples)});
  return *this;
}

Axes& Axes::add(std::string name, std::vector<int64_t> values, std::string units, std::string convention) {
  return add_axis({std::move(name), std::move(units), std::move(convention)}, {values.begin(), values.end()});
}

Axes& Axes::add(std::string name, std::vector<double> values, std::string units, std::string convention) {
  return add_axis({std::move(name), std::move(units), std::move(convention)}, {values.begin(), values.end()});
}

Axes& Axes::add(std::string name, std::vector<std::string> values, std::string convention) {
  return add_axis({std::move(name), "", std::move(convention)}, {values.begin(), values.end()});
}

std::size_t Axes::size() const {
  std::size_t n = 1;
  for (const Axis& a : axes_) n *= a.steps.size();
  return n;
}

std::vector<AxisPoint> Axes::product() const {
  std::vector<AxisPoint> points;
  if (size() == 0) return points;
  std::vector<std::size_t> index(axes_.size(), 0);
  for (std::size_t count = 0; count < size(); ++count) {
    AxisPoint p;
    for (std::size_t a = 0; a < axes_.size(); ++a)
      for (std::size_t c = 0; c < axes_[a].columns.size(); ++c)
        p.values_.emplace_back(axes_[a].columns[c].name, axes_[a].steps[index[a]][c]);
    points.push_back(std::move(p));
    for (std::size_t a = axes_.size(); a-- > 0;) {  // odometer: the last axis turns fastest
      if (++index[a] < axes_[a].steps.size()) break;
      index[a] = 0;
    }
  }
  return points;
}

void Axes::declare_columns(Table& cases) const {
  for (const Axis& a : axes_) {
    for (std::size_t c = 0; c < a.columns.size(); ++c) {
      const AxisValue& first = a.steps.empty() ? AxisValue{std::string()} : a.steps.front()[c];
      const ColumnKind kind = std::holds_alternative<int64_t>(first)  ? ColumnKind::int64
                              : std::holds_alternative<double>(first) ? ColumnKind::float64
                                                                      : ColumnKind::string;
      cases.add_column(a.columns[c].name, kind, a.columns[c].units, a.columns[c].convention);
    }
  }
}

void Axes::fill(Table& row, const AxisPoint& point) const {
  for (const auto& [name, v] : point.values_) {
    if (const auto* i = std::get_if<int64_t>(&v)) row.set(name, *i);
    else if (const auto* d = std::get_if<double>(&v)) row.set(name, *d);
    else row.set(name, std::get<std::string>(v));
  }
}

}  // namespace strata
