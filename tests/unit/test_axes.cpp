// Parameter axes: the product in odometer order, one typed column per axis, labels.
#include <gtest/gtest.h>

#include "bench/axes.h"

namespace strata {
namespace {

TEST(Axes, ProductTurnsTheLastAxisFastest) {
  Axes axes;
  axes.add("dtype", std::vector<std::string>{"fp32", "fp64"}).add("size", std::vector<int64_t>{256, 512, 1024});
  const auto points = axes.product();
  ASSERT_EQ(points.size(), 6u);
  EXPECT_EQ(points[0].label(), "dtype=fp32 size=256");
  EXPECT_EQ(points[1].integer("size"), 512);
  EXPECT_EQ(points[3].text("dtype"), "fp64");
  EXPECT_EQ(points[5].label(), "dtype=fp64 size=1024");
  EXPECT_THROW(points[0].integer("dtype"), std::invalid_argument);
  EXPECT_THROW(points[0].text("missing"), std::invalid_argument);
}

TEST(Axes, ColumnsAreDeclaredOnceWithTheirKindAndFilledPerCase) {
  Axes axes;
  axes.add("scale", std::vector<double>{0.5, 2.0}, "1").add("n", std::vector<int64_t>{3}, "B");
  Table cases("cases");
  axes.declare_columns(cases);
  for (const AxisPoint& p : axes.product()) {
    axes.fill(cases, p);
    cases.end_row();
  }
  EXPECT_EQ(cases.rows(), 2u);
  EXPECT_EQ(cases.column("scale").kind, ColumnKind::float64);
  EXPECT_EQ(cases.column("n").units, "B");
  EXPECT_DOUBLE_EQ(cases.column("scale").reals[1], 2.0);
  EXPECT_EQ(cases.column("n").ints[0], 3);
  EXPECT_THROW(axes.add("n", std::vector<int64_t>{1}), std::invalid_argument);
}

TEST(Axes, AnEmptyAxisMeansNoCases) {
  Axes axes;
  axes.add("a", std::vector<int64_t>{1, 2}).add("b", std::vector<std::string>{});
  EXPECT_TRUE(axes.product().empty());
}

}  // namespace
}  // namespace strata
