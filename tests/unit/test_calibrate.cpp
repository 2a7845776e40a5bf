// Calibration (project/calibrate.h, bench/project/calibration_input.h) and the system description's version 2
// (project/system.h, bench/project/system_json.h): fits that recover known parameters from synthetic times, whole result
// files written with the real results writer whose times follow known GEMM efficiencies, latencies, bandwidths
// and slowdowns, the lookups the measured points and fitted models answer, the JSON round trip, and every
// validation error naming its field.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <stdexcept>
#include <unistd.h>

#include "bench/project/calibration_input.h"
#include "bench/harness/machine.h"
#include "bench/project/system_json.h"
#include "project/calibrate.h"
#include "project/system.h"
#include "results/h5.h"
#include "results/writer.h"

namespace strata::project {
namespace {

double relative_error(double got, double want) { return std::abs(got - want) / std::abs(want); }

System small_system();  // a description with round numbers, below

// ---- synthetic series ----------------------------------------------------------------------------------------

// S = 8 B, 32 B, ... 64 MiB (x4): the sizes a strata-collective suite run covers.
std::vector<double> suite_sizes() {
  std::vector<double> sizes;
  for (double s = 8; s <= 64.0 * (1 << 20); s *= 4) sizes.push_back(s);
  return sizes;
}

TEST(CalibrateFits, LatencyBandwidthIsRecoveredExactlyAndUnderNoise) {
  const double alpha = 3e-6, beta = 5e9;
  std::vector<double> x, t;
  for (double s : suite_sizes()) x.push_back(s), t.push_back(alpha + s / beta);
  const LinearFit exact = fit_relative(x, t);
  EXPECT_LT(relative_error(exact.intercept, alpha), 1e-9);
  EXPECT_LT(relative_error(1 / exact.slope, beta), 1e-9);
  EXPECT_LT(exact.residual, 1e-9);
  // 3% multiplicative noise (seeded): alpha and beta within 5%, and the residual says about 3%.
  std::mt19937_64 random(7);
  std::normal_distribution<double> noise(0, 0.03);
  for (double& v : t) v *= 1 + noise(random);
  const LinearFit noisy = fit_relative(x, t);
  EXPECT_LT(relative_error(noisy.intercept, alpha), 0.05);
  EXPECT_LT(relative_error(1 / noisy.slope, beta), 0.05);
  EXPECT_GT(noisy.residual, 0.015);
  EXPECT_LT(noisy.residual, 0.05);
  EXPECT_GT(noisy.intercept_se, 0);
  // Bounds: times that fall with size give no negative bandwidth; a flat series no negative latency.
  const LinearFit falling = fit_relative({1, 2, 3}, {3, 2, 1});
  EXPECT_GE(falling.intercept, 0);
  EXPECT_GE(falling.slope, kMinSlope);
}

TEST(CalibrateFits, TwoRegimesGiveTwoRangesWithTheBreakBetweenThem) {
  // An eager protocol below 64 KiB, rendezvous above: different latency and bandwidth.
  SizeSeries series;
  series.bus_factor = 1;  // allreduce at n = 2
  for (double s : suite_sizes()) {
    series.bytes.push_back(s);
    series.seconds.push_back(s <= 65536 ? 1e-6 + s / 2e9 : 20e-6 + s / 10e9);
  }
  const RangesFit fit = fit_ranges(series);
  ASSERT_EQ(fit.ranges.size(), 2u);
  EXPECT_EQ(fit.ranges[0].up_to_bytes, 32768);  // the last measured size of the first regime (8 x 4^k)
  EXPECT_TRUE(std::isinf(fit.ranges[1].up_to_bytes));
  EXPECT_LT(relative_error(fit.ranges[0].model.latency.value, 1e-6), 1e-3);
  EXPECT_LT(relative_error(fit.ranges[0].model.bandwidth.value, 2e9), 1e-3);
  EXPECT_LT(relative_error(fit.ranges[1].model.latency.value, 20e-6), 1e-3);
  EXPECT_LT(relative_error(fit.ranges[1].model.bandwidth.value, 10e9), 1e-3);
  EXPECT_LT(fit.residual, 1e-6);
  // One regime: one range (more would cost more parameters than they save).
  SizeSeries one = series;
  for (size_t i = 0; i < one.bytes.size(); ++i) one.seconds[i] = 5e-6 + one.bytes[i] / 4e9;
  EXPECT_EQ(fit_ranges(one).ranges.size(), 1u);
  // With 5% noise (seeded) still one: extra ranges must pay for their parameters.
  std::mt19937_64 random(11);
  std::normal_distribution<double> noise(0, 0.05);
  for (double& t : one.seconds) t *= 1 + noise(random);
  EXPECT_EQ(fit_ranges(one).ranges.size(), 1u);
  EXPECT_THROW(fit_ranges({{8, 16}, {1e-6, 2e-6}, 1}), std::invalid_argument);
}

TEST(CalibrateFits, ALaterRangeMayBeASteeperPieceWhoseLineCrossesZeroBelowIt) {
  // In the cache up to 512 KiB (1 us + S / 10 GB/s), then four times slower per byte: beyond the first range the
  // line of the tail is -80 us + S / 2.5 GB/s, positive from 256 KiB up.
  SizeSeries series;
  for (double s = 8; s <= 32.0 * (1 << 20); s *= 2) {
    series.bytes.push_back(s);
    series.seconds.push_back(s <= 524288 ? 1e-6 + s / 10e9 : -80e-6 + s / 2.5e9);
  }
  const RangesFit fit = fit_ranges(series);
  ASSERT_EQ(fit.ranges.size(), 2u);
  EXPECT_LT(relative_error(fit.ranges[1].model.latency.value, -80e-6), 1e-3);
  EXPECT_LT(relative_error(fit.ranges[1].model.bandwidth.value, 2.5e9), 1e-3);
  EXPECT_LT(relative_error(fit.ranges[0].model.latency.value, 1e-6), 1e-3);
  EXPECT_LT(fit.residual, 1e-6);
  CollectiveModel m;
  m.algorithm = "ring";
  m.ranks = 2;
  m.ranges = fit.ranges;
  System s = small_system();
  s.collectives = {m};
  EXPECT_FALSE(find_problem(s).has_value());
}

TEST(CalibrateFits, EchosChunkedFormIsKeptWhereTheTimesStepPerChunk) {
  // 256 KiB chunks of 40 us each on top of 2 us and 50 GB/s: a staircase a few ranges cannot follow.
  SizeSeries series;
  series.bus_factor = 2.0 * 3 / 4;  // allreduce at n = 4
  for (double s = 64 * 1024; s <= 64.0 * (1 << 20); s *= 2) {
    const double x = s * series.bus_factor;
    series.bytes.push_back(s);
    series.seconds.push_back(2e-6 + std::ceil(x / 262144) * 40e-6 + x / 50e9);
  }
  const CollectiveModel m = fit_collective(coll::Operation::allreduce, "ring", GroupKind::inter_node, 4, series, "test");
  ASSERT_EQ(m.form, CollectiveForm::chunked) << m.source;
  EXPECT_EQ(m.chunked.chunk_bytes, 262144);
  EXPECT_LT(relative_error(m.chunked.per_chunk.value, 40e-6), 1e-3);
  EXPECT_LT(relative_error(m.chunked.bandwidth.value, 50e9), 1e-2);
  EXPECT_LT(m.compared.at("chunked"), m.compared.at("latency_bandwidth"));
  EXPECT_NE(m.source.find("kept chunked"), std::string::npos);
  // The model answers the measured sizes.
  for (size_t i = 0; i < series.bytes.size(); ++i)
    EXPECT_LT(relative_error(m.seconds(series.bytes[i], 4), series.seconds[i]), 1e-3) << series.bytes[i];
}

TEST(CalibrateFits, EfficiencyCurveAndBootstrap) {
  // Efficiencies rising with size: the curve holds one point per quarter decade at their median.
  const EfficiencyCurve c = fit_efficiency({{1e6, 0.2}, {1e6, 0.3}, {1e8, 0.6}, {1e10, 0.8}}, "test");
  ASSERT_EQ(c.points.size(), 3u);
  EXPECT_DOUBLE_EQ(c.points[0].efficiency, 0.25);
  EXPECT_DOUBLE_EQ(c.points[2].efficiency, 0.8);
  EXPECT_NEAR(c.relative_spread, std::sqrt((0.2 * 0.2 + 0.2 * 0.2) / 4), 1e-3);  // the 0.2 and 0.3 about 0.25
  EXPECT_DOUBLE_EQ(fit_efficiency({{1e9, 0.5}}, "one", 0.07).relative_spread, 0.07);
  // Above the peak (a peak measured on a busy machine): clipped to 1.
  EXPECT_DOUBLE_EQ(fit_efficiency({{1e9, 1.4}}, "clip").points[0].efficiency, 1.0);

  const MedianInterval m = bootstrap_median({1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6});
  EXPECT_DOUBLE_EQ(m.median, 1.3);
  EXPECT_LE(m.low, m.median);
  EXPECT_GE(m.high, m.median);
  EXPECT_GT(m.high - m.low, 0);
  const MedianInterval again = bootstrap_median({1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6});
  EXPECT_EQ(again.low, m.low);  // seeded: the same interval every time
}

TEST(CalibrateFits, AShapeMeasuredBySeveralRunsIsOnePointAtTheirMedian) {
  // make run's passes measure the steps' GEMM and attention shapes three times each: one point per shape, at the
  // median of the three (a lookup takes a shape's first point, so three points would mean the first run alone).
  CalibrationInput input;
  input.peaks["fp32"] = {1e11, 0, "test"};
  for (double seconds : {3e-4, 1e-4, 2e-4}) {
    input.gemm.push_back({"fp32", 256, 192, 64, seconds, 0.01});
    AttentionShape shape{4, 4, 4, 64, 64, 16, true, false};
    input.attention.push_back({"fp32", shape, seconds / 10, 0.01});
  }
  const Calibration c = calibrate(input, nullptr, "");
  const ComputePeak& fp32 = c.system.device.compute.at("fp32");
  ASSERT_EQ(fp32.gemm_points.size(), 1u);
  EXPECT_DOUBLE_EQ(fp32.gemm_points[0].seconds.value, 2e-4);
  ASSERT_EQ(fp32.attention_points.size(), 1u);
  EXPECT_DOUBLE_EQ(fp32.attention_points[0].seconds.value, 2e-5);
  EXPECT_DOUBLE_EQ(fp32.attention_points[0].seconds.relative_spread, 0.5);  // (max - min) / (2 median)
}

TEST(CalibrateFits, AKernelMeasuredEvictedTakesOnlyItsEvictedMeasurements) {
  // Files of different ages: AdamW timed hot (before strata-elementwise evicted its operands) at 200 GB/s and evicted
  // at 100 GB/s; the rate and its spread are the evicted one's, and the report says what was left out. A kernel only
  // ever timed hot keeps its hot rate.
  CalibrationInput input;
  input.peaks["fp32"] = {1e11, 0, "test"};
  input.elementwise.push_back({"adamw", 2e6, 1e-5, 0.5, false});
  input.elementwise.push_back({"adamw", 2e6, 2e-5, 0.01, true});
  input.elementwise.push_back({"residual_add", 1e6, 1e-5, 0.01, false});
  const Calibration c = calibrate(input, nullptr, "");
  EXPECT_DOUBLE_EQ(c.system.device.elementwise_kernels.at("adamw").value, 1e11);
  EXPECT_DOUBLE_EQ(c.system.device.elementwise_kernels.at("adamw").relative_spread, 0.01);
  EXPECT_DOUBLE_EQ(c.system.device.elementwise_bandwidth->relative_spread, 0.01);
  EXPECT_DOUBLE_EQ(c.system.device.elementwise_kernels.at("residual_add").value, 1e11);
  EXPECT_DOUBLE_EQ(c.system.device.elementwise_bandwidth->value, 3e6 / 3e-5);
  const bool reported = std::any_of(c.report.begin(), c.report.end(), [](const std::string& line) {
    return line == "elementwise kernel adamw: 1 measurement(s) with hot operands left out for the evicted ones";
  });
  EXPECT_TRUE(reported);
}

TEST(CalibrateFits, OverlapFasterThanAloneIsNoise) {
  // Slowdowns below 1 on every case: the median (0.95 - 1) is noise; s is 0 and its source says so.
  CalibrationInput input;
  for (double f : {0.93, 0.95, 0.97}) input.interference.push_back({"gemm", "allreduce", 1e6, f, f});
  const Calibration c = calibrate(input, nullptr, "");
  EXPECT_EQ(c.system.overlap_slowdown.value, 0);
  EXPECT_NE(c.system.overlap_slowdown.source.find("taken as 0"), std::string::npos);
  EXPECT_GT(c.system.overlap_slowdown.relative_spread, 0);
  EXPECT_FALSE(c.missing.empty());  // everything else is
}

// ---- lookups on measured points and fitted models -----------------------------------------------------------

System small_system() {
  System s;
  s.name = "small";
  s.device.name = "d";
  s.device.devices_per_node = 4;
  ComputePeak& c = s.device.compute["fp32"];
  c.peak_flops = {1e12, 0, ""};
  c.efficiency = {{{1e6, 0.2}, {1e12, 0.8}}, 0.1, ""};
  s.device.memory_bandwidth = {1e11, 0, ""};
  s.device.memory_efficiency = {1, 0, ""};
  s.intra_node.bandwidth = {100e9, 0, ""};
  s.intra_node.latency = {1e-6, 0, ""};
  s.inter_node.bandwidth = {10e9, 0, ""};
  s.inter_node.latency = {10e-6, 0, ""};
  s.overlap_slowdown = {0.1, 0, ""};
  return s;
}

TEST(CalibratedLookups, GemmTakesItsPointThenSimilarShapesThenTheRoofline) {
  System s = small_system();
  ComputePeak& c = s.device.compute.at("fp32");
  // Square points at efficiency 0.5 (1024^3) and 0.7 (4096^3).
  const auto time_at = [](double m, double efficiency) { return 2 * m * m * m / (1e12 * efficiency); };
  c.gemm_points = {{1024, 1024, 1024, {time_at(1024, 0.5), 0.02, ""}}, {4096, 4096, 4096, {time_at(4096, 0.7), 0.02, ""}}};
  EXPECT_DOUBLE_EQ(s.device.gemm_seconds("fp32", 1024, 1024, 1024), time_at(1024, 0.5));
  // 2048^3 lies halfway in log FLOPs: efficiency 0.6.
  EXPECT_NEAR(s.device.gemm_seconds("fp32", 2048, 2048, 2048), time_at(2048, 0.6), time_at(2048, 0.6) * 1e-12);
  // A square shape beyond the points: the curve (log10(2 * 8192^3) of the way from 1e6 to 1e12).
  const double f = 2.0 * 8192 * 8192 * 8192;
  EXPECT_NEAR(s.device.gemm_seconds("fp32", 8192, 8192, 8192), f / (1e12 * c.efficiency.at(f)), 1e-12);
  // A skinny shape of the same FLOPs as 2048^3 is not read off square points: the roofline, memory-bound here.
  const double skinny = s.device.gemm_seconds("fp32", 8, 1 << 20, 1 << 10);
  const double bytes = 4.0 * (8.0 * 1024 + (1 << 20) * 1024.0 + 8.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(skinny, bytes / 1e11);
  EXPECT_THROW(s.device.gemm_seconds("fp8", 8, 8, 8), std::invalid_argument);
}

TEST(CalibratedLookups, AttentionTakesItsPointThenItsPassCurve) {
  System s = small_system();
  ComputePeak& c = s.device.compute.at("fp32");
  const AttentionShape a{1, 8, 8, 512, 512, 64, true, false};
  const AttentionShape b{1, 8, 8, 2048, 2048, 64, true, false};
  c.attention_points = {{a, {a.flops() / (1e12 * 0.4), 0, ""}}, {b, {b.flops() / (1e12 * 0.6), 0, ""}}};
  EXPECT_DOUBLE_EQ(s.device.attention_seconds("fp32", a), a.flops() / (1e12 * 0.4));
  const AttentionShape mid{1, 8, 8, 1024, 1024, 64, true, false};
  EXPECT_NEAR(s.device.attention_seconds("fp32", mid), mid.flops() / (1e12 * 0.5), 1e-15);
  // Backward has no points: its curve where there is one, else the GEMM curve.
  const AttentionShape backward{1, 8, 8, 1024, 1024, 64, true, true};
  EXPECT_DOUBLE_EQ(s.device.attention_seconds("fp32", backward),
                   backward.flops() / (1e12 * c.efficiency.at(backward.flops())));
  c.attention_efficiency["bwd"] = {{{1, 0.3}}, 0, ""};
  EXPECT_DOUBLE_EQ(s.device.attention_seconds("fp32", backward), backward.flops() / (1e12 * 0.3));
  EXPECT_DOUBLE_EQ(backward.flops(), 2.5 * mid.flops());
}

TEST(CalibratedLookups, CollectivesTakeTheirRangeAndNearestGroupSizeElseTheTier) {
  System s = small_system();
  CollectiveModel m;
  m.op = coll::Operation::allreduce;
  m.algorithm = "ring";
  m.group = GroupKind::intra_node;
  m.ranks = 2;
  m.ranges = {{4096, {{1e-6, 0, ""}, {1e9, 0, ""}}, 0, 3}, {INFINITY, {{5e-6, 0, ""}, {4e9, 0, ""}}, 0, 3}};
  s.collectives.push_back(m);
  // n = 2: bus factor 1.
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 4096, 2), 1e-6 + 4096 / 1e9);
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 8192, 2), 5e-6 + 8192 / 4e9);
  // n = 4 scales through the bus factor 1.5.
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 8192, 4),
                   5e-6 + 8192 * 1.5 / 4e9);
  // A measured n = 8 is nearer to 6 than n = 2.
  CollectiveModel eight = m;
  eight.ranks = 8;
  eight.ranges = {{INFINITY, {{9e-6, 0, ""}, {2e9, 0, ""}}, 0, 3}};
  s.collectives.push_back(eight);
  EXPECT_EQ(s.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 6)->ranks, 8);
  EXPECT_EQ(s.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 3)->ranks, 2);
  // Another algorithm, or kind: the tier. A hierarchical group takes the inter-node tier.
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "library", GroupKind::intra_node, 1e6, 2),
                   1e-6 + 1e6 / 100e9);
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::hierarchical, 1e6, 2),
                   10e-6 + 1e6 / 10e9);
  EXPECT_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 1e6, 1), 0);
  // Measured sizes first: a point's time, log-log between two points; outside them, or at another group size, the fit.
  s.collectives[0].points = {{1024, {10e-6, 0, ""}}, {4096, {40e-6, 0, ""}}};
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 1024, 2), 10e-6);
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 4096, 2), 40e-6);
  EXPECT_NEAR(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 2048, 2), 20e-6, 1e-15);
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 8192, 2), 5e-6 + 8192 / 4e9);
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 512, 2), 1e-6 + 512 / 1e9);
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 2048, 3),
                   1e-6 + 2048 * (4.0 / 3) / 1e9);
  // A call takes a model of its own mode first: a blocking one the blocking-mode model, a pipelined one the pipelined.
  CollectiveModel blocking = m;
  blocking.blocking = true;
  blocking.ranges = {{INFINITY, {{30e-6, 0, ""}, {1e9, 0, ""}}, 0, 3}};
  s.collectives.push_back(blocking);
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 8192, 2, 1, true),
                   30e-6 + 8192 / 1e9);
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, 8192, 2), 5e-6 + 8192 / 4e9);
  EXPECT_EQ(s.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 6, true)->ranks, 2);  // its mode first
  // ... but the group size measured before the mode: a blocking call of 8 takes the pipelined model of 8.
  const CollectiveModel* eight_ranks = s.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 8, true);
  EXPECT_EQ(eight_ranks->ranks, 8);
  EXPECT_FALSE(eight_ranks->blocking);
  EXPECT_FALSE(find_problem(s).has_value());  // the same operation in two modes is no repeat
  // Of an operation timed in one mode only, a call of the other mode takes that measurement before the tier's model.
  CollectiveModel only_blocking = blocking;
  only_blocking.op = coll::Operation::allgather;
  s.collectives.push_back(only_blocking);
  EXPECT_DOUBLE_EQ(s.collective_seconds(coll::Operation::allgather, "ring", GroupKind::intra_node, 8192, 2), 30e-6 + 8192 * 0.5 / 1e9);
  EXPECT_EQ(group_kind_of({0, 0, 0}), GroupKind::intra_node);
  EXPECT_EQ(group_kind_of({0, 1, 2}), GroupKind::inter_node);
  EXPECT_EQ(group_kind_of({0, 0, 1, 1}), GroupKind::hierarchical);
}

// ---- the JSON form, version 2 ------------------------------------------------------------------------------

System full_system() {
  System s = small_system();
  s.device.fused_into_gemm = {"fill_bias", "bias_gradient"};
  s.device.attention_kernels["flash-triton"] = {{0.7, 0.07, "measured"}, {0.5, 0.15, "measured"}};
  ComputePeak& c = s.device.compute.at("fp32");
  c.gemm_points = {{256, 512, 1024, {1.5e-4, 0.03, ""}}};
  c.attention_points = {{{2, 8, 2, 512, 1024, 64, true, true}, {2.5e-3, 0.01, ""}}};
  c.attention_efficiency["fwd"] = {{{1e6, 0.3}, {1e9, 0.6}}, 0.05, "fitted"};
  s.intra_node.source = "measured";
  CollectiveModel ranges;
  ranges.op = coll::Operation::reduce_scatter;
  ranges.algorithm = "library";
  ranges.group = GroupKind::hierarchical;
  ranges.ranks = 8;
  ranges.ranges = {{1.0 / 3 * 1e5, {{1e-6, 0.1, ""}, {1e9, 0.2, ""}}, 0.04, 5}, {INFINITY, {{4e-6, 0.1, ""}, {8e9, 0.2, ""}}, 0.02, 6}};
  ranges.compared = {{"latency_bandwidth", 0.03}, {"chunked", 0.05}};
  ranges.points = {{1e4, {2e-5, 0.05, ""}}, {1e5, {3e-5, 0.1, ""}}};
  ranges.source = "fitted";
  CollectiveModel chunked;
  chunked.op = coll::Operation::allgather;
  chunked.algorithm = "ring";
  chunked.group = GroupKind::inter_node;
  chunked.ranks = 2;
  chunked.form = CollectiveForm::chunked;
  chunked.blocking = true;
  chunked.chunked = {{2e-6, 0.1, ""}, 262144, {4e-5, 0.02, ""}, {5e10, 0.1, ""}, 0.01, 12};
  s.collectives = {ranges, chunked};
  s.collective_contention = Quantity{0.15, 0.5, "measured"};
  s.communication_slowdown = Quantity{0.2, 0.3, "measured"};
  return s;
}

TEST(SystemJsonV2, RoundTripKeepsEveryNewField) {
  const System s = full_system();
  ASSERT_FALSE(find_problem(s).has_value()) << *find_problem(s);
  const auto text = system_to_json(s).dump(2);
  const System back = system_from_json(nlohmann::json::parse(text), "<test>");
  EXPECT_EQ(system_to_json(back).dump(2), text);
  EXPECT_EQ(back.version, kSystemFormatVersion);
  EXPECT_EQ(back.collectives.size(), 2u);
  EXPECT_EQ(back.collectives[1].form, CollectiveForm::chunked);
  EXPECT_TRUE(back.collectives[1].blocking);
  EXPECT_FALSE(back.collectives[0].blocking);
  ASSERT_EQ(back.collectives[0].points.size(), 2u);
  EXPECT_EQ(back.collectives[0].points[1].seconds.relative_spread, 0.1);
  EXPECT_TRUE(std::isinf(back.collectives[0].ranges[1].up_to_bytes));
  EXPECT_EQ(back.device.compute.at("fp32").attention_points[0].shape.kv_heads, 2);
  EXPECT_TRUE(back.device.compute.at("fp32").attention_points[0].shape.backward);
  ASSERT_TRUE(back.collective_contention.has_value());
  EXPECT_DOUBLE_EQ(back.collective_contention->value, 0.15);
  EXPECT_EQ(back.device.fused_into_gemm, (std::set<std::string, std::less<>>{"bias_gradient", "fill_bias"}));
  ASSERT_EQ(back.device.attention_kernels.size(), 1u);
  EXPECT_EQ(back.device.attention_kernels.at("flash-triton").forward.value, 0.7);
  EXPECT_EQ(back.device.attention_kernels.at("flash-triton").backward.relative_spread, 0.15);
  EXPECT_EQ(back.device.attention_kernels.at("flash-triton").forward.source, "measured");
  // A kernel fused into the GEMM costs nothing, launch gap included; one that is not takes its pass.
  EXPECT_EQ(back.device.elementwise_seconds("bias fill", 1e6), 0);
  EXPECT_EQ(back.device.elementwise_seconds("bias grad", 1e6), 0);
  System unfused = back;
  unfused.device.fused_into_gemm.clear();
  EXPECT_GT(unfused.device.elementwise_seconds("bias fill", 1e6), 0);
  // The file form: written whole, readable, one line per measured point.
  const auto path = std::filesystem::temp_directory_path() / ("strata-v2-" + std::to_string(::getpid()) + ".json");
  strata::write_system(path.string(), s);
  std::ifstream in(path);
  const std::string file((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(file.find("{\"m\": 256, \"n\": 512, \"k\": 1024, \"seconds\": 0.00015, \"spread\": 0.03}"), std::string::npos) << file;
  EXPECT_EQ(system_to_json(strata::read_system(path.string())).dump(2), text);
  std::filesystem::remove(path);
}

TEST(SystemJsonV2, VersionOneFilesStillRead) {
  nlohmann::json v1 = system_to_json(small_system());
  v1["version"] = 1;
  v1["network"]["intra_node"].erase("source");
  const System read = system_from_json(v1, "<v1>");
  EXPECT_EQ(read.version, kSystemFormatVersion);
  EXPECT_TRUE(read.collectives.empty());
  EXPECT_FALSE(read.collective_contention.has_value());
  // Version 2's fields are not version 1's.
  nlohmann::json with_kernels = v1;
  with_kernels["device"]["attention_kernels"] = nlohmann::json::object();
  EXPECT_THROW(system_from_json(with_kernels, "<v1>"), std::invalid_argument);
  v1["collective_contention"] = 0.1;
  try {
    system_from_json(v1, "<v1>");
    ADD_FAILURE() << "a version 2 field in a version 1 file was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("collective_contention: unknown field"), std::string::npos) << e.what();
  }
}

TEST(SystemJsonV2, EveryValidationErrorNamesItsField) {
  struct Case {
    std::function<void(System&)> mutate;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](System& s) { s.device.compute.at("fp32").gemm_points[0].m = 0; }, "device.compute.fp32.gemm_points[0].m"},
      {[](System& s) { s.device.compute.at("fp32").gemm_points[0].k = -4; }, "device.compute.fp32.gemm_points[0].k"},
      {[](System& s) { s.device.compute.at("fp32").gemm_points[0].seconds.value = -1; },
       "device.compute.fp32.gemm_points[0].seconds must be positive"},
      {[](System& s) { s.device.compute.at("fp32").gemm_points[0].seconds.relative_spread = -1; },
       "device.compute.fp32.gemm_points[0].seconds.spread"},
      {[](System& s) { s.device.compute.at("fp32").attention_points[0].shape.kv_heads = 3; },
       "device.compute.fp32.attention_points[0].kv_heads must divide heads"},
      {[](System& s) { s.device.compute.at("fp32").attention_points[0].shape.seq_kv = 0; },
       "device.compute.fp32.attention_points[0].seq_kv"},
      {[](System& s) { s.device.compute.at("fp32").attention_points[0].seconds.value = 0; },
       "device.compute.fp32.attention_points[0].seconds"},
      {[](System& s) { s.device.compute.at("fp32").attention_efficiency["fwd"].points[1].efficiency = 1.5; },
       "device.compute.fp32.attention_efficiency.fwd.points[1] efficiency"},
      {[](System& s) { s.device.compute.at("fp32").attention_efficiency["sideways"] = {{{1, 0.5}}, 0, ""}; },
       "device.compute.fp32.attention_efficiency.sideways"},
      {[](System& s) { s.collectives[0].algorithm.clear(); }, "collectives[0].algorithm"},
      {[](System& s) { s.device.fused_into_gemm.insert("gelu_forward"); },
       "device.fused_into_gemm: 'gelu_forward' is no kernel a GEMM's epilogue applies"},
      {[](System& s) { s.device.attention_kernels.at("flash-triton").backward.value = 0; },
       "device.attention_kernels.flash-triton.backward must be positive"},
      {[](System& s) { s.device.attention_kernels["unfused"] = {{1, 0, ""}, {1, 0, ""}}; },
       "device.attention_kernels.unfused: 'unfused' names how attention runs"},
      {[](System& s) { s.device.attention_kernels[""] = {{1, 0, ""}, {1, 0, ""}}; },
       "device.attention_kernels: a kernel needs a name"},
      {[](System& s) { s.collectives[0].ranks = 1; }, "collectives[0].ranks must be at least 2"},
      {[](System& s) { s.collectives[0].ranges.clear(); }, "collectives[0].ranges must hold"},
      {[](System& s) { s.collectives[0].points[1].bytes = 1e4; }, "collectives[0].points[1].bytes must exceed"},
      {[](System& s) { s.collectives[0].points[0].bytes = 0; }, "collectives[0].points[0].bytes must be positive"},
      {[](System& s) { s.collectives[0].points[1].seconds.value = -1; }, "collectives[0].points[1].seconds must be positive"},
      {[](System& s) { s.collectives.push_back(s.collectives[1]); }, "collectives[2] repeats an earlier entry's"},
      {[](System& s) { s.collectives[0].ranges[1].up_to_bytes = 1e9; }, "collectives[0].ranges[1].up_to_bytes must be absent"},
      {[](System& s) { s.collectives[0].ranges[0].up_to_bytes = INFINITY; }, "collectives[0].ranges[0].up_to_bytes must be positive"},
      {[](System& s) { s.collectives[0].ranges[0].model.bandwidth.value = -1e9; },
       "collectives[0].ranges[0].bandwidth must be positive"},
      {[](System& s) { s.collectives[0].ranges[0].model.latency.value = -1e-6; },
       "collectives[0].ranges[0].latency must not be negative"},
      {[](System& s) { s.collectives[0].ranges[1].model.latency.value = -1e-3; },
       "collectives[0].ranges[1].latency makes the time at the range's start"},
      {[](System& s) { s.collectives[0].ranges[1].model.latency.value = NAN; }, "collectives[0].ranges[1].latency must be a number"},
      {[](System& s) { s.collectives[0].ranges[0].residual = -0.1; }, "collectives[0].ranges[0].residual"},
      {[](System& s) { s.collectives[0].compared["chunked"] = NAN; }, "collectives[0].compared.chunked"},
      {[](System& s) { s.collectives[1].chunked.chunk_bytes = 0; }, "collectives[1].chunk_bytes must be positive"},
      {[](System& s) { s.collectives[1].chunked.per_chunk.value = -1; }, "collectives[1].per_chunk must not be negative"},
      {[](System& s) { s.collectives[1].chunked.bandwidth.value = 0; }, "collectives[1].bandwidth must be positive"},
      {[](System& s) { s.collectives[1].chunked.latency.value = NAN; }, "collectives[1].latency"},
      {[](System& s) { s.collectives.push_back(s.collectives[1]); }, "collectives[2] repeats"},
      {[](System& s) { s.collective_contention->value = -0.2; }, "collective_contention must not be negative"},
      {[](System& s) { s.communication_slowdown->relative_spread = -1; }, "communication_slowdown.spread"},
  };
  for (const Case& c : cases) {
    System s = full_system();
    c.mutate(s);
    const auto problem = find_problem(s);
    ASSERT_TRUE(problem.has_value()) << "accepted; expected a problem with " << c.field;
    EXPECT_NE(problem->find(c.field), std::string::npos) << *problem << " (expected " << c.field << ")";
  }
  // The reader names malformed fields of the new parts too.
  nlohmann::json doc = system_to_json(full_system());
  doc["collectives"][0]["group"] = "rack";
  EXPECT_THROW(system_from_json(doc, "<test>"), std::invalid_argument);
  doc = system_to_json(full_system());
  doc["device"]["compute"]["fp32"]["gemm_points"][0]["m"] = 2.5;
  try {
    system_from_json(doc, "<test>");
    ADD_FAILURE() << "a fractional m was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("device.compute.fp32.gemm_points[0].m: must be an integer"), std::string::npos)
        << e.what();
  }
  for (const char* form : {"", "linear"}) {
    doc = system_to_json(full_system());
    doc["collectives"][0]["form"] = form;
    try {
      system_from_json(doc, "<test>");
      ADD_FAILURE() << "form '" << form << "' was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("collectives[0].form: must be latency_bandwidth or chunked (got '") +
                                           form + "')"),
                std::string::npos)
          << e.what();
    }
  }
  doc = system_to_json(full_system());
  doc["collectives"][1]["mode"] = "eager";
  try {
    system_from_json(doc, "<test>");
    ADD_FAILURE() << "an unknown mode was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("collectives[1].mode: must be pipelined or blocking (got eager)"), std::string::npos)
        << e.what();
  }
}

// ---- whole result files ------------------------------------------------------------------------------------

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    char pattern[] = "/tmp/strata-calibrate-XXXXXX";
    path = mkdtemp(pattern);
    h5::silence_library_errors();
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// The machine every synthetic run says it ran on: 100 GFLOP/s fp32 and 50 fp64 on one core; STREAM copy 20 GB/s
// and triad 15 GB/s on one core, 30 on both (so 15 per rank at two ranks per node).
std::string machine_json() {
  MachineDescription m;
  m.cpu.vendor = "Test";
  m.cpu.model_name = "Test CPU";
  m.topology.cores = 2;
  m.topology.source = "test";
  m.fp32 = {100e9, 200e9, 2, "test chains", ""};
  m.fp64 = {50e9, 100e9, 2, "test chains", ""};
  m.bf16 = {0, 0, 2, "", ""};
  m.memory.copy = {20e9, 30e9};
  m.memory.triad = {15e9, 30e9};
  m.memory.cores = 2;
  m.gemm_probe_size = 64;
  return nlohmann::json::array({to_json(m)}).dump();
}

class FileBuilder {
 public:
  explicit FileBuilder(std::string path) : path_(std::move(path)) {}

  // One run: its cases and summary tables (each row's "case" set here), and optional extra tables.
  void run(const std::string& benchmark, const Table& cases, const Table& summary, const std::vector<Table>& extra = {},
           const std::string& config = "{}", int ranks = 2, int nodes = 1, const std::string& status = "ok") {
    ResultsWriter w(path_, "run-" + std::to_string(++runs_), {{"benchmark", benchmark}, {"config_json", config},
                    {"n_ranks", std::to_string(ranks)}, {"n_nodes", std::to_string(nodes)}, {"hosts", "[\"testhost\"]"},
                    {"launcher", "mpirun"}, {"start_utc", "2026-01-01T00:00:00Z"}});
    w.write_env({{"machine_json", machine_json()}, {"blas_threads_per_rank", "1"}, {"gemm_default_backend", "openblas"}});
    w.append(cases);
    w.append(summary);
    for (const Table& t : extra) w.append(t);
    w.finish(status);
  }

 private:
  std::string path_;
  int runs_ = 0;
};

// GEMM: squares 64..1024 at efficiency 0.2 + 0.15 log2(m / 64) of the 100 GFLOP/s peak; fp64 at half the rate.
double gemm_efficiency(int64_t m) { return 0.2 + 0.15 * std::log2(static_cast<double>(m) / 64); }

void write_gemm(FileBuilder& file) {
  Table cases("cases"), summary("summary");
  cases.add_column("case", ColumnKind::int64, "1").add_column("backend", ColumnKind::string, "")
      .add_column("dtype", ColumnKind::string, "").add_column("library", ColumnKind::string, "")
      .add_column("m", ColumnKind::int64, "1").add_column("n", ColumnKind::int64, "1").add_column("k", ColumnKind::int64, "1");
  summary.add_column("case", ColumnKind::int64, "1");
  for (const char* stat : {"median", "p05", "p95"}) summary.add_column(std::string("time_rankmean_") + stat, ColumnKind::float64, "s");
  int index = 0;
  for (const char* dtype : {"fp32", "fp64"})
    for (int64_t m = 64; m <= 1024; m *= 2) {
      const double peak = std::string(dtype) == "fp32" ? 100e9 : 50e9;
      const double seconds = 2.0 * m * m * m / (peak * gemm_efficiency(m));
      cases.set("case", index).set("backend", "cpu").set("dtype", dtype).set("library", "openblas")
          .set("m", m).set("n", m).set("k", m).end_row();
      summary.set("case", index).set("time_rankmean_median", seconds).set("time_rankmean_p05", 0.98 * seconds)
          .set("time_rankmean_p95", 1.02 * seconds).end_row();
      ++index;
    }
  file.run("strata-gemm", cases, summary);
}

// Collectives at n = 2 on one node (intra) and on two emulated nodes of one rank (inter): allreduce on the ring
// with two regimes, sendrecv as point-to-point.
struct Regime {
  double up_to, alpha, beta;
};
const std::vector<Regime> kIntraAllreduce = {{65536, 1e-6, 2e9}, {INFINITY, 20e-6, 10e9}};
const std::vector<Regime> kInterAllreduce = {{INFINITY, 5e-6, 3e9}};
const std::vector<Regime> kIntraSendrecv = {{INFINITY, 0.5e-6, 8e9}};
const std::vector<Regime> kInterSendrecv = {{INFINITY, 2e-6, 4e9}};

double regime_time(const std::vector<Regime>& regimes, double bytes, double factor) {
  for (const Regime& r : regimes)
    if (bytes <= r.up_to) return r.alpha + bytes * factor / r.beta;
  return 0;
}

// The columns of strata-collective's cases and summary that calibration reads.
void add_collective_columns(Table& cases, Table& summary) {
  cases.add_column("case", ColumnKind::int64, "1").add_column("operation", ColumnKind::string, "")
      .add_column("algo", ColumnKind::string, "").add_column("size_bytes", ColumnKind::float64, "B")
      .add_column("group_size", ColumnKind::int64, "1").add_column("group_kind", ColumnKind::string, "")
      .add_column("n_nodes", ColumnKind::int64, "1").add_column("ranks_per_node", ColumnKind::int64, "1")
      .add_column("emulated_nodes", ColumnKind::int64, "1").add_column("backend", ColumnKind::string, "")
      .add_column("mode", ColumnKind::string, "").add_column("concurrent_with", ColumnKind::string, "")
      .add_column("grid", ColumnKind::string, "");
  summary.add_column("case", ColumnKind::int64, "1").add_column("time_rankmax_median", ColumnKind::float64, "s")
      .add_column("slowdown_vs_alone", ColumnKind::float64, "1");
}

// The k-th size's time off the regime by (-1)^(k+1) x jitter, relative (a fit's residual).
double jittered(std::size_t k, double jitter) { return 1 + (k % 2 ? jitter : -jitter); }

// `slower`: every time that many times the regimes' (another mode's or another run's times of the same sizes);
// `jitter`: as jittered(); `placements`: cases per size in the run (in place, out of place, ...), the c-th 10 % c
// slower than the first.
void write_collectives(FileBuilder& file, bool emulated, const char* mode = "pipelined", double slower = 1.0,
                       double jitter = 0, int placements = 1) {
  Table cases("cases"), summary("summary"), groups("groups");
  add_collective_columns(cases, summary);
  groups.add_column("case", ColumnKind::int64, "1").add_column("group", ColumnKind::int64, "1")
      .add_column("world_ranks", ColumnKind::string, "");
  int index = 0;
  for (const char* op : {"allreduce", "sendrecv"})
    for (std::size_t k = 0; k < suite_sizes().size(); ++k)
    for (int placement = 0; placement < placements; ++placement) {
      const double s = suite_sizes()[k];
      const bool allreduce = std::string(op) == "allreduce";
      const auto& regimes = allreduce ? (emulated ? kInterAllreduce : kIntraAllreduce)
                                      : (emulated ? kInterSendrecv : kIntraSendrecv);
      cases.set("case", index).set("operation", op).set("algo", "ring").set("size_bytes", s).set("group_size", 2)
          .set("group_kind", "world").set("n_nodes", emulated ? 2 : 1).set("ranks_per_node", emulated ? 1 : 2)
          .set("emulated_nodes", emulated ? 1 : 0).set("backend", "mpi").set("mode", mode)
          .set("concurrent_with", "").set("grid", "").end_row();
      summary.set("case", index)
          .set("time_rankmax_median", (1 + 0.1 * placement) * slower * jittered(k, jitter) * regime_time(regimes, s, 1.0))
          .set("slowdown_vs_alone", NAN).end_row();
      groups.set("case", index).set("group", 0).set("world_ranks", "0,1").end_row();
      ++index;
    }
  Table ranks("ranks");
  ranks.add_column("rank", ColumnKind::int64, "1").add_column("node_index", ColumnKind::int64, "1");
  ranks.set("rank", 0).set("node_index", 0).end_row();
  ranks.set("rank", 1).set("node_index", 0).end_row();
  file.run("strata-collective", cases, summary, {groups, ranks});
}

// --mixed at tp=2, dp=2: the concurrent rows' slowdowns 1.1, 1.2, 1.3 (median 1.2).
void write_mixed(FileBuilder& file) {
  Table cases("cases"), summary("summary");
  add_collective_columns(cases, summary);
  const double slowdowns[] = {1.1, 1.2, 1.3};
  for (int i = 0; i < 3; ++i) {
    cases.set("case", i).set("operation", "allreduce").set("algo", "ring").set("size_bytes", 65536.0 * (i + 1))
        .set("group_size", 2).set("group_kind", "tp").set("n_nodes", 1).set("ranks_per_node", 4).set("emulated_nodes", 0)
        .set("backend", "mpi").set("mode", "blocking").set("concurrent_with", "reduce_scatter/dp")
        .set("grid", "tp=2,pp=1,dp=2").end_row();
    summary.set("case", i).set("time_rankmax_median", 1e-4).set("slowdown_vs_alone", slowdowns[i]).end_row();
  }
  file.run("strata-collective", cases, summary, {}, "{\"mixed\":true}", 4, 1);
}

// Interference: compute slowdowns 1.05 .. 1.25 (median 1.15), communication slowdowns 1.5 each.
void write_interference(FileBuilder& file) {
  Table cases("cases"), summary("summary");
  cases.add_column("case", ColumnKind::int64, "1").add_column("kernel", ColumnKind::string, "")
      .add_column("kernel_shape", ColumnKind::string, "").add_column("operation", ColumnKind::string, "")
      .add_column("algo", ColumnKind::string, "").add_column("size_bytes", ColumnKind::float64, "B")
      .add_column("section", ColumnKind::string, "").add_column("overlapped", ColumnKind::int64, "1");
  summary.add_column("case", ColumnKind::int64, "1").add_column("slowdown_vs_alone", ColumnKind::float64, "1");
  int index = 0;
  const double compute[] = {1.05, 1.10, 1.15, 1.20, 1.25};
  for (int size = 0; size < 5; ++size)
    for (const char* section : {"compute", "communication"})
      for (int overlapped : {0, 1}) {
        cases.set("case", index).set("kernel", "gemm").set("kernel_shape", "512x512x512").set("operation", "allreduce")
            .set("algo", "ring").set("size_bytes", 1048576.0 * (size + 1)).set("section", section)
            .set("overlapped", overlapped).end_row();
        const double slowdown = !overlapped ? 1.0 : std::string(section) == "compute" ? compute[size] : 1.5;
        summary.set("case", index).set("slowdown_vs_alone", slowdown).end_row();
        ++index;
      }
  file.run("strata-interference", cases, summary);
}

TEST(CalibrateFiles, RecoversTheKnownParametersOfSyntheticRuns) {
  TempDir dir;
  const std::string path = dir.file("synthetic.h5");
  FileBuilder file(path);
  write_gemm(file);
  write_collectives(file, false);
  write_collectives(file, true);
  write_mixed(file);
  write_interference(file);
  // A failed run is skipped, whatever it holds.
  Table empty_cases("cases"), empty_summary("summary");
  empty_cases.add_column("case", ColumnKind::int64, "1");
  empty_summary.add_column("case", ColumnKind::int64, "1");
  file.run("strata-gemm", empty_cases, empty_summary, {}, "{}", 2, 1, "failed");

  const CalibrationFiles read = read_calibration_input({path}, "auto");
  EXPECT_EQ(read.host, "testhost");
  EXPECT_EQ(read.input.devices_per_node, 2);
  bool skipped = false;
  for (const auto& note : read.notes) skipped = skipped || note.find("status failed: skipped") != std::string::npos;
  EXPECT_TRUE(skipped);
  const Calibration c = calibrate(read.input, nullptr, "");
  ASSERT_TRUE(c.missing.empty()) << c.missing.front();
  const System& s = c.system;
  ASSERT_FALSE(find_problem(s).has_value());

  // Peaks and memory from the machine description: one core's peak for one thread; memory per rank.
  EXPECT_DOUBLE_EQ(s.device.compute.at("fp32").peak_flops.value, 100e9);
  EXPECT_DOUBLE_EQ(s.device.compute.at("fp64").peak_flops.value, 50e9);
  EXPECT_DOUBLE_EQ(s.device.memory_bandwidth.value, 15e9);  // min(one core, all cores / 2) of the larger of copy, triad
  EXPECT_DOUBLE_EQ(s.device.memory_efficiency.value, 1.0);
  // GEMM: every point at its time; the curve at each measured size holds its efficiency (to the 4 digits kept).
  const ComputePeak& fp32 = s.device.compute.at("fp32");
  ASSERT_EQ(fp32.gemm_points.size(), 5u);
  for (int64_t m = 64; m <= 1024; m *= 2) {
    const double flops = 2.0 * m * m * m;
    EXPECT_LT(relative_error(fp32.efficiency.at(flops), gemm_efficiency(m)), 1e-3) << m;
    EXPECT_LT(relative_error(s.device.gemm_seconds("fp32", m, m, m), flops / (100e9 * gemm_efficiency(m))), 1e-4) << m;
  }
  EXPECT_NEAR(fp32.gemm_points[0].seconds.relative_spread, 0.02, 1e-9);

  // Collectives: the intra allreduce's two regimes, the inter one's single range, both recovered to 0.1%.
  const CollectiveModel* intra = s.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 2);
  ASSERT_NE(intra, nullptr);
  ASSERT_EQ(intra->form, CollectiveForm::latency_bandwidth);
  ASSERT_EQ(intra->ranges.size(), 2u);
  EXPECT_EQ(intra->ranges[0].up_to_bytes, 32768);
  EXPECT_LT(relative_error(intra->ranges[0].model.latency.value, 1e-6), 1e-3);
  EXPECT_LT(relative_error(intra->ranges[0].model.bandwidth.value, 2e9), 1e-3);
  EXPECT_LT(relative_error(intra->ranges[1].model.latency.value, 20e-6), 1e-3);
  EXPECT_LT(relative_error(intra->ranges[1].model.bandwidth.value, 10e9), 1e-3);
  const CollectiveModel* inter = s.find_collective(coll::Operation::allreduce, "ring", GroupKind::inter_node, 2);
  ASSERT_NE(inter, nullptr);
  ASSERT_EQ(inter->ranges.size(), 1u);
  EXPECT_LT(relative_error(inter->ranges[0].model.latency.value, 5e-6), 1e-3);
  EXPECT_LT(relative_error(inter->ranges[0].model.bandwidth.value, 3e9), 1e-3);
  EXPECT_NE(inter->source.find("emulated"), std::string::npos);
  // The tiers from sendrecv.
  EXPECT_LT(relative_error(s.intra_node.latency.value, 0.5e-6), 1e-3);
  EXPECT_LT(relative_error(s.intra_node.bandwidth.value, 8e9), 1e-3);
  EXPECT_LT(relative_error(s.inter_node.latency.value, 2e-6), 1e-3);
  EXPECT_LT(relative_error(s.inter_node.bandwidth.value, 4e9), 1e-3);
  EXPECT_NE(s.inter_node.source.find("emulated"), std::string::npos);
  EXPECT_EQ(s.intra_node.source.find("emulated"), std::string::npos);

  // Contention and the slowdowns: the medians less 1.
  ASSERT_TRUE(s.collective_contention.has_value());
  EXPECT_NEAR(s.collective_contention->value, 0.2, 1e-9);
  EXPECT_NEAR(s.overlap_slowdown.value, 0.15, 1e-9);
  EXPECT_GT(s.overlap_slowdown.relative_spread, 0);
  ASSERT_TRUE(s.communication_slowdown.has_value());
  EXPECT_NEAR(s.communication_slowdown->value, 0.5, 1e-9);
  // The report names every fit with its residual.
  std::string report;
  for (const auto& line : c.report) report += line + "\n";
  EXPECT_NE(report.find("allreduce ring intra_node n=2: latency-bandwidth"), std::string::npos) << report;
  EXPECT_NE(report.find("residual"), std::string::npos);
  EXPECT_NE(report.find("overlap slowdown s = 0.1500"), std::string::npos) << report;
}

// The relative residual of a collective's fit at `bytes`: its size range's, or the chunked form's.
double fit_residual_at(const CollectiveModel& m, double bytes) {
  if (m.form == CollectiveForm::chunked) return m.chunked.residual;
  const auto range = std::find_if(m.ranges.begin(), m.ranges.end(), [bytes](const SizeRange& r) { return bytes <= r.up_to_bytes; });
  return range == m.ranges.end() ? m.ranges.back().residual : range->residual;
}

TEST(CalibrateFiles, APointTimedInPlaceAndOutOfPlaceByOneRunIsOneRunsMeasurement) {
  TempDir dir;
  const std::string path = dir.file("placements.h5");
  FileBuilder file(path);
  write_gemm(file);
  write_collectives(file, false, "pipelined", 1, 0.05, 2);  // one run, each size twice: 1x and 1.1x
  write_collectives(file, false, "blocking", 1, 0, 2);  // two runs, each twice: medians 1.05x and 1.26x
  write_collectives(file, false, "blocking", 1.2, 0, 2);
  write_collectives(file, true);
  write_interference(file);
  const Calibration c = calibrate(read_calibration_input({path}, "auto").input, nullptr, "");
  ASSERT_TRUE(c.missing.empty()) << c.missing.front();
  const CollectiveModel* m = c.system.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 2);
  ASSERT_NE(m, nullptr);
  ASSERT_EQ(m->points.size(), suite_sizes().size());
  for (std::size_t i = 0; i < suite_sizes().size(); ++i) {
    const double bytes = suite_sizes()[i];
    EXPECT_LT(relative_error(m->points[i].seconds.value, 1.05 * jittered(i, 0.05) * regime_time(kIntraAllreduce, bytes, 1.0)),
              1e-3) << bytes;
    // The run's two cases are not two runs: no spread of their own (half their range would be 0.048), the fit's
    // residual there.
    const double residual = fit_residual_at(*m, bytes);
    EXPECT_GT(residual, 0.02) << bytes;
    EXPECT_NEAR(m->points[i].seconds.relative_spread, residual, 1e-3 * residual) << bytes;
  }
  // Two runs: each run's median first, then half their range (pooling the four times would give 0.139).
  const CollectiveModel* b = c.system.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 2, true);
  ASSERT_TRUE(b != nullptr && b->blocking);
  ASSERT_EQ(b->points.size(), suite_sizes().size());
  for (std::size_t i = 0; i < suite_sizes().size(); ++i) {
    const double alone = regime_time(kIntraAllreduce, suite_sizes()[i], 1.0);
    EXPECT_LT(relative_error(b->points[i].seconds.value, 0.5 * (1.05 + 1.26) * alone), 1e-3) << suite_sizes()[i];
    EXPECT_NEAR(b->points[i].seconds.relative_spread, (1.26 - 1.05) / (1.05 + 1.26), 1e-3) << suite_sizes()[i];
  }
}

TEST(CalibrateFiles, EachModeOfACollectiveIsAModelWithItsMeasuredSizes) {
  TempDir dir;
  const std::string path = dir.file("modes.h5");
  FileBuilder file(path);
  write_gemm(file);
  write_collectives(file, false, "pipelined", 1, 0.05);  // pipelined, 5 % off the regimes size by size: once
  write_collectives(file, false, "blocking", 2);  // blocking, twice as slow: three runs, the median 2x
  write_collectives(file, false, "blocking", 1.8);
  write_collectives(file, false, "blocking", 2.4);
  write_collectives(file, true);
  write_interference(file);
  const CalibrationFiles read = read_calibration_input({path}, "auto");
  const Calibration c = calibrate(read.input, nullptr, "");
  ASSERT_TRUE(c.missing.empty()) << c.missing.front();
  const System& s = c.system;
  ASSERT_FALSE(find_problem(s).has_value()) << *find_problem(s);
  const CollectiveModel* pipelined = s.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 2);
  const CollectiveModel* blocking = s.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 2, true);
  ASSERT_NE(pipelined, nullptr);
  ASSERT_NE(blocking, nullptr);
  EXPECT_FALSE(pipelined->blocking);
  EXPECT_TRUE(blocking->blocking);
  EXPECT_NE(blocking->source.find("--mode blocking"), std::string::npos) << blocking->source;
  // Each measured size is a point at the median over its runs (to the significant digits kept), half their range its
  // spread.
  ASSERT_EQ(blocking->points.size(), suite_sizes().size());
  ASSERT_EQ(pipelined->points.size(), suite_sizes().size());
  for (std::size_t i = 0; i < suite_sizes().size(); ++i) {
    const double bytes = suite_sizes()[i];
    const double alone = regime_time(kIntraAllreduce, bytes, 1.0);
    EXPECT_EQ(blocking->points[i].bytes, bytes);
    EXPECT_LT(relative_error(blocking->points[i].seconds.value, 2 * alone), 1e-3) << bytes;
    EXPECT_NEAR(blocking->points[i].seconds.relative_spread, 0.15, 1e-3) << bytes;
    EXPECT_LT(relative_error(pipelined->points[i].seconds.value, jittered(i, 0.05) * alone), 1e-3) << bytes;
    // Timed by one run: no spread of its own, the fit's residual at that size.
    const double residual = fit_residual_at(*pipelined, bytes);
    EXPECT_GT(residual, 0.02) << bytes;
    EXPECT_NEAR(pipelined->points[i].seconds.relative_spread, residual, 1e-3 * residual) << bytes;
    // A blocking call takes the blocking model; any other the pipelined one.
    EXPECT_LT(relative_error(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, bytes, 2, 1, true),
                             2 * alone), 1e-3) << bytes;
    EXPECT_LT(relative_error(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::intra_node, bytes, 2),
                             jittered(i, 0.05) * alone), 1e-3) << bytes;
  }
  // The tier without sendrecv in blocking mode still comes from its point-to-point sizes; the emulated inter-node
  // allreduce, timed pipelined only, serves a blocking call too.
  const CollectiveModel* inter = s.find_collective(coll::Operation::allreduce, "ring", GroupKind::inter_node, 2, true);
  ASSERT_NE(inter, nullptr);
  EXPECT_FALSE(inter->blocking);
  // The description keeps both through its file.
  const System back = system_from_json(nlohmann::json::parse(system_to_json(s).dump()), "<test>");
  EXPECT_TRUE(back.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 2, true)->blocking);
  EXPECT_EQ(back.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 2, true)->points.size(),
            suite_sizes().size());
}

// A base's models of a collective measured here, in either mode, give way to the measurement; the base's models of
// collectives not measured here stay, marked.
TEST(CalibrateFiles, AFreshMeasurementReplacesTheBasesModelsOfItInBothModes) {
  TempDir dir;
  const std::string path = dir.file("pipelined.h5");
  FileBuilder file(path);
  write_gemm(file);
  write_collectives(file, false);  // the ring allreduce on two ranks, pipelined only
  System base = small_system();
  CollectiveModel old;
  old.op = coll::Operation::allreduce, old.algorithm = "ring", old.group = GroupKind::intra_node, old.ranks = 2;
  old.blocking = true;
  old.ranges = {{INFINITY, {{1e-3, 0, ""}, {1e6, 0, ""}}, 0, 3}};
  base.collectives.push_back(old);
  CollectiveModel other = old;
  other.op = coll::Operation::allgather;
  base.collectives.push_back(other);
  other.blocking = false;  // the allgather in both modes: neither measured here, both kept
  base.collectives.push_back(other);
  base.device.fused_into_gemm = {"fill_bias", "bias_gradient"};
  base.device.attention_kernels["flash-triton"] = {{0.7, 0.07, "published"}, {0.5, 0.15, "published"}};
  CalibrationInput input = read_calibration_input({path}, "auto").input;
  const Calibration c = calibrate(input, &base, "base.json");
  // A framework's other attention kernels keep the base's speeds, marked as not measured here.
  ASSERT_EQ(c.system.device.attention_kernels.size(), 1u);
  const AttentionKernel& triton = c.system.device.attention_kernels.at("flash-triton");
  EXPECT_EQ(triton.forward.value, 0.7);
  EXPECT_EQ(triton.backward.relative_spread, 0.15);
  EXPECT_NE(triton.backward.source.find("not measured here: from base.json"), std::string::npos)
      << triton.backward.source;
  // The GEMM library's epilogues are the base's, unless the step's elementwise kernels were measured (the CPU step,
  // which runs its biases as passes).
  EXPECT_EQ(c.system.device.fused_into_gemm, base.device.fused_into_gemm);
  input.elementwise.push_back({"fill_bias", 1e6, 1e-4, 0.01});
  EXPECT_TRUE(calibrate(input, &base, "base.json").system.device.fused_into_gemm.empty());
  const System& s = c.system;
  const CollectiveModel* allreduce = s.find_collective(coll::Operation::allreduce, "ring", GroupKind::intra_node, 2, true);
  ASSERT_NE(allreduce, nullptr);
  EXPECT_FALSE(allreduce->blocking) << "the base's blocking allreduce outlived a fresh measurement of it";
  const CollectiveModel* allgather = s.find_collective(coll::Operation::allgather, "ring", GroupKind::intra_node, 2, true);
  ASSERT_NE(allgather, nullptr);
  EXPECT_TRUE(allgather->blocking);
  EXPECT_NE(allgather->source.find("not measured here: from base.json"), std::string::npos) << allgather->source;
  EXPECT_FALSE(s.find_collective(coll::Operation::allgather, "ring", GroupKind::intra_node, 2, false)->blocking);
}

TEST(CalibrateFiles, AGpuGemmRunMakesTheDeviceTheGpuWhoseMemoryComesFromTheBase) {
  TempDir dir;
  const std::string path = dir.file("gpu.h5");
  FileBuilder file(path);
  write_gemm(file);  // CPU runs in the same file are left out once the device is the GPU
  Table cases("cases"), summary("summary");
  cases.add_column("case", ColumnKind::int64, "1").add_column("backend", ColumnKind::string, "")
      .add_column("dtype", ColumnKind::string, "").add_column("library", ColumnKind::string, "")
      .add_column("m", ColumnKind::int64, "1").add_column("n", ColumnKind::int64, "1").add_column("k", ColumnKind::int64, "1");
  summary.add_column("case", ColumnKind::int64, "1").add_column("peak_per_rank", ColumnKind::float64, "FLOP/s")
      .add_column("peak_source", ColumnKind::string, "");
  for (const char* stat : {"median", "p05", "p95"}) summary.add_column(std::string("time_rankmean_") + stat, ColumnKind::float64, "s");
  for (int i = 0; i < 3; ++i) {
    const int64_t m = 4096 << i;
    const double seconds = 2.0 * m * m * m / (989e12 * 0.6);
    cases.set("case", i).set("backend", "cuda").set("dtype", "bf16").set("library", "cublaslt").set("m", m).set("n", m)
        .set("k", m).end_row();
    summary.set("case", i).set("peak_per_rank", 989e12).set("peak_source", "H100 table").set("time_rankmean_median", seconds)
        .set("time_rankmean_p05", seconds).set("time_rankmean_p95", seconds).end_row();
  }
  file.run("strata-gemm", cases, summary, {}, "{\"backend\":\"cuda\"}");
  const CalibrationFiles read = read_calibration_input({path}, "auto");
  ASSERT_EQ(read.input.gemm.size(), 3u);
  EXPECT_EQ(read.input.peaks.at("bf16").value, 989e12);
  EXPECT_FALSE(read.input.memory_bandwidth.has_value());
  const Calibration alone = calibrate(read.input, nullptr, "");
  std::string missing;
  for (const auto& m : alone.missing) missing += m + "\n";
  EXPECT_NE(missing.find("no measured memory bandwidth"), std::string::npos) << missing;
  const System base = small_system();
  const Calibration merged = calibrate(read.input, &base, "spec.json");
  ASSERT_TRUE(merged.missing.empty());
  EXPECT_EQ(merged.system.device.compute.count("fp32"), 0u);  // the GPU's dtypes only
  EXPECT_NEAR(merged.system.device.compute.at("bf16").efficiency.at(2.0 * 8192 * 8192 * 8192), 0.6, 1e-3);
  EXPECT_NE(merged.system.device.memory_bandwidth.source.find("not measured here: from spec.json"), std::string::npos);
  // Told to, the same file describes the CPU.
  EXPECT_EQ(read_calibration_input({path}, "cpu").input.gemm.size(), 10u);
}

TEST(CalibrateFiles, MissingBenchmarksAreNamedAndABaseStandsInMarked) {
  TempDir dir;
  const std::string path = dir.file("gemm-only.h5");
  FileBuilder file(path);
  write_gemm(file);
  const CalibrationFiles read = read_calibration_input({path}, "auto");
  const Calibration alone = calibrate(read.input, nullptr, "");
  std::string missing;
  for (const auto& m : alone.missing) missing += m + "\n";
  EXPECT_NE(missing.find("no strata-collective run with intra-node groups"), std::string::npos) << missing;
  EXPECT_NE(missing.find("the inter_node tier cannot be fitted"), std::string::npos) << missing;
  EXPECT_NE(missing.find("no strata-interference run"), std::string::npos) << missing;
  EXPECT_EQ(missing.find("strata-gemm"), std::string::npos) << missing;

  const System base = small_system();
  const Calibration merged = calibrate(read.input, &base, "base.json");
  ASSERT_TRUE(merged.missing.empty());
  const System& s = merged.system;
  EXPECT_DOUBLE_EQ(s.inter_node.bandwidth.value, 10e9);
  EXPECT_NE(s.inter_node.source.find("not measured here: from base.json"), std::string::npos);
  EXPECT_NE(s.overlap_slowdown.source.find("not measured here"), std::string::npos);
  EXPECT_DOUBLE_EQ(s.device.compute.at("fp32").peak_flops.value, 100e9);  // measured wins over the base
  EXPECT_FALSE(s.collective_contention.has_value());

  // Not a results file at all: the reader's refusal, a std::invalid_argument (exit 2 in the program).
  const std::string text = dir.file("notes.txt");
  std::ofstream(text) << "not hdf5\n";
  EXPECT_THROW(read_calibration_input({text}, "auto"), std::invalid_argument);
  EXPECT_THROW(read_calibration_input({path}, "tpu"), std::invalid_argument);
}

}  // namespace
}  // namespace strata::project
