// Parameter axes: the product in odometer order, one typed column per axis, labels.
#include <gtest/gtest.h>

#include "bench/harness/axes.h"

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

TEST(Axes, AnAxisOfOneValueIsAConstantColumnWithItsConvention) {
  Axes axes;
  axes.add("strategy", std::vector<std::string>{"NNN", "GGG"}, "P.G.OS")
      .add("parameters", std::vector<double>{1.5e6}, "1", "Ψ")
      .add("micro_batch", std::vector<int64_t>{4}, "1", "rows per rank")
      .add("seq", std::vector<int64_t>{32});
  Table cases("cases");
  axes.declare_columns(cases);
  EXPECT_EQ(cases.column("strategy").convention, "P.G.OS");
  EXPECT_EQ(cases.column("parameters").convention, "Ψ");
  EXPECT_EQ(cases.column("micro_batch").convention, "rows per rank");
  EXPECT_EQ(cases.column("seq").convention, "parameter axis");
  const auto points = axes.product();
  ASSERT_EQ(points.size(), 2u);
  for (const AxisPoint& p : points) {
    axes.fill(cases, p);
    cases.end_row();
  }
  EXPECT_EQ(cases.column("strategy").texts[1], "GGG");
  EXPECT_EQ(cases.column("micro_batch").ints[1], 4);
  EXPECT_DOUBLE_EQ(cases.column("parameters").reals[0], 1.5e6);
}

TEST(Axes, AnEmptyAxisMeansNoCases) {
  Axes axes;
  axes.add("a", std::vector<int64_t>{1, 2}).add("b", std::vector<std::string>{});
  EXPECT_TRUE(axes.product().empty());
}

TEST(Axes, ZippedColumnsStepTogetherAsOneAxis) {
  Axes axes;
  axes.add("dtype", std::vector<std::string>{"fp32", "fp64"})
      .add_zipped({{"m", "1"}, {"source", ""}}, {{int64_t{64}, std::string("a")}, {int64_t{128}, std::string("b")}});
  const auto points = axes.product();
  ASSERT_EQ(points.size(), 4u);
  EXPECT_EQ(points[1].label(), "dtype=fp32 m=128 source=b");
  EXPECT_EQ(points[2].label(), "dtype=fp64 m=64 source=a");
  Table cases("cases");
  axes.declare_columns(cases);
  EXPECT_EQ(cases.column("m").kind, ColumnKind::int64);
  EXPECT_EQ(cases.column("source").kind, ColumnKind::string);
  axes.fill(cases, points[3]);
  cases.end_row();
  EXPECT_EQ(cases.column("m").ints[0], 128);
  EXPECT_THROW(axes.add_zipped({{"k", "1"}}, {{int64_t{1}, int64_t{2}}}), std::invalid_argument);
  EXPECT_THROW(axes.add_zipped({{"k", "1"}}, {{int64_t{1}}, {std::string("x")}}), std::invalid_argument);
  EXPECT_THROW(axes.add_zipped({{"m", "1"}}, {{int64_t{1}}}), std::invalid_argument);
}

}  // namespace
}  // namespace strata
