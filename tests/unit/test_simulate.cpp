// The projection layer: the system description (project/system.h), its JSON form (bench/project/system_json.h) and the
// timeline simulator (project/simulate.h), against closed forms a person can compute by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <tuple>

#include <unistd.h>

#include "bench/project/system_json.h"
#include "bench/project/timeline_trace.h"
#include "project/simulate.h"
#include "project/system.h"
#include "project/trace_workload.h"

namespace strata::project {
namespace {

constexpr double kRel = 1e-12;  // the simulator's arithmetic is exact up to rounding

// A small system with round numbers: 100 TFLOP/s bf16 at 50% above 1 GFLOP per call (25% below 1 MFLOP),
// 1 TB/s memory at 80%, 8 devices per node, NVLink-like 100 GB/s and 2 us inside, 10 GB/s and 10 us between.
System test_system() {
  System s;
  s.name = "test";
  s.device.name = "test device";
  s.device.devices_per_node = 8;
  s.device.compute["bf16"].peak_flops = {100e12, 0.05, "round"};
  s.device.compute["bf16"].efficiency = {{{1e6, 0.25}, {1e9, 0.5}}, 0.1, "round"};
  s.device.compute["fp32"].peak_flops = {20e12, 0, ""};
  s.device.compute["fp32"].efficiency = {{{1, 1.0}}, 0, ""};
  s.device.memory_bandwidth = {1e12, 0, ""};
  s.device.memory_efficiency = {0.8, 0, ""};
  s.intra_node.bandwidth = {100e9, 0, ""};
  s.intra_node.latency = {2e-6, 0, ""};
  s.inter_node.bandwidth = {10e9, 0, ""};
  s.inter_node.latency = {10e-6, 0, ""};
  s.overlap_slowdown = {0.25, 0, ""};
  return s;
}

double relative_error(double got, double want) { return std::abs(got - want) / std::abs(want); }

#define EXPECT_CLOSE(got, want) EXPECT_LE(relative_error((got), (want)), kRel) << (got) << " against " << (want)

// ---- the system description -----------------------------------------------------------------------------

TEST(SystemDescription, EfficiencyIsPiecewiseLinearInLogFlopsAndConstantOutside) {
  const System s = test_system();
  const EfficiencyCurve& c = s.device.compute.at("bf16").efficiency;
  EXPECT_DOUBLE_EQ(c.at(1e3), 0.25);
  EXPECT_DOUBLE_EQ(c.at(1e6), 0.25);
  EXPECT_NEAR(c.at(1e7), 0.25 + 0.25 / 3, 1e-15);  // one decade of three
  EXPECT_NEAR(c.at(std::sqrt(1e6 * 1e9)), 0.375, 1e-15);
  EXPECT_DOUBLE_EQ(c.at(1e12), 0.5);
}

TEST(SystemDescription, ValidationNamesTheFirstProblem) {
  EXPECT_FALSE(find_problem(test_system()).has_value());
  auto expect_problem = [](System s, const std::string& field) {
    const auto problem = find_problem(s);
    ASSERT_TRUE(problem.has_value()) << "no problem found; expected one with " << field;
    EXPECT_NE(problem->find(field), std::string::npos) << *problem;
  };
  System s = test_system();
  s.inter_node.bandwidth.value = -1;
  expect_problem(s, "network.inter_node.bandwidth must be positive");
  s = test_system();
  s.intra_node.latency.value = -1e-6;
  expect_problem(s, "network.intra_node.latency must not be negative");
  s = test_system();
  s.device.compute.at("bf16").peak_flops.value = 0;
  expect_problem(s, "device.compute.bf16.peak_flops");
  s = test_system();
  s.device.compute.at("bf16").efficiency.points = {{1e9, 0.5}, {1e6, 0.6}};
  expect_problem(s, "device.compute.bf16.efficiency.points[1]");
  s = test_system();
  s.device.compute.at("fp32").efficiency.points = {{1, 1.5}};
  expect_problem(s, "device.compute.fp32.efficiency.points[0] efficiency must be in (0, 1]");
  s = test_system();
  s.device.compute.at("fp32").efficiency.points.clear();
  expect_problem(s, "device.compute.fp32.efficiency.points must hold");
  s = test_system();
  s.device.compute.clear();
  expect_problem(s, "device.compute must name");
  s = test_system();
  s.device.devices_per_node = 0;
  expect_problem(s, "device.devices_per_node");
  s = test_system();
  s.device.memory_bandwidth.value = std::nan("");
  expect_problem(s, "device.memory_bandwidth");
  s = test_system();
  s.overlap_slowdown.value = -0.1;
  expect_problem(s, "overlap_slowdown");
  s = test_system();
  s.overlap_slowdown.relative_spread = -0.1;
  expect_problem(s, "overlap_slowdown.spread");
  s = test_system();
  s.overlap_slowdown.relative_spread = 1e308;  // an interval out to 10^308 s says nothing
  expect_problem(s, "overlap_slowdown.spread must be a relative spread from 0 to 100");
  s = test_system();
  s.inter_node.collectives[coll::Operation::allgather] = {{1e-6, 0, ""}, {-5, 0, ""}};
  expect_problem(s, "network.inter_node.collectives.allgather.bandwidth");
  s = test_system();
  s.version = 1;
  expect_problem(s, "version must be 2");
}

TEST(SystemDescription, BusFactorsAreThoseOfNcclTests) {
  EXPECT_DOUBLE_EQ(coll::bus_factor(coll::Operation::allreduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(coll::bus_factor(coll::Operation::allgather, 4), 0.75);
  EXPECT_DOUBLE_EQ(coll::bus_factor(coll::Operation::reduce_scatter, 8), 0.875);
  EXPECT_DOUBLE_EQ(coll::bus_factor(coll::Operation::alltoall, 2), 0.5);
  EXPECT_DOUBLE_EQ(coll::bus_factor(coll::Operation::broadcast, 8), 1);
  // A collective's own model replaces the tier's.
  System s = test_system();
  s.inter_node.collectives[coll::Operation::allgather] = {{1e-3, 0, ""}, {1e9, 0, ""}};
  EXPECT_CLOSE(s.inter_node.collective_seconds(coll::Operation::allgather, 4e9, 4), 1e-3 + 3.0);
  EXPECT_CLOSE(s.inter_node.collective_seconds(coll::Operation::allreduce, 4e9, 4), 10e-6 + 6e9 / 10e9);
  EXPECT_EQ(s.inter_node.collective_seconds(coll::Operation::allreduce, 4e9, 1), 0);
}

TEST(SystemDescription, AGroupOnSeveralNodesCrossesThemOnEveryMembersLink) {
  const System s = test_system();
  // One member per node: the inter-node tier. Four per node: four NICs at once, 40 GB/s; eight, 80; twelve: capped
  // by the intra-node link's 100 GB/s. A ring allreduce of 8 ranks has bus factor 1.75.
  EXPECT_CLOSE(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::inter_node, 8e9, 8), 10e-6 + 14e9 / 10e9);
  EXPECT_CLOSE(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::hierarchical, 8e9, 8, 1), 10e-6 + 14e9 / 10e9);
  EXPECT_CLOSE(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::hierarchical, 8e9, 8, 4), 10e-6 + 14e9 / 40e9);
  EXPECT_CLOSE(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::hierarchical, 8e9, 16, 8),
               10e-6 + 8e9 * coll::bus_factor(coll::Operation::allreduce, 16) / 80e9);
  EXPECT_CLOSE(s.collective_seconds(coll::Operation::allreduce, "ring", GroupKind::hierarchical, 8e9, 24, 12),
               10e-6 + 8e9 * coll::bus_factor(coll::Operation::allreduce, 24) / 100e9);
  EXPECT_EQ(members_per_node({0, 0, 1, 1, 1, 2, 2}), 2);
  EXPECT_EQ(members_per_node({0, 1, 2}), 1);
}

// Two protocols with round numbers: one slow per step at full bandwidth, one quick per step at half.
RingLatency test_ring() {
  RingLatency ring;
  ring.protocols["simple"] = {{10e-6, 0, ""}, {4e-6, 0, ""}, {20e-6, 0, ""}, 1.0};
  ring.protocols["ll128"] = {{20e-6, 0, ""}, {1e-6, 0, ""}, {5e-6, 0, ""}, 0.5, 0.25};
  return ring;
}

TEST(SystemDescription, ARingAcrossManyNodesWaitsForEachOfItsSteps) {
  System s = test_system();
  s.ring_latency = test_ring();
  // 512 ranks on 64 nodes of 8: 511 steps, 63 between nodes; 8 NICs at 10 GB/s, 80 GB/s.
  const double bus = 1e8 * coll::bus_factor(coll::Operation::allgather, 512);
  const double simple = 10e-6 + 448 * 4e-6 + 63 * 20e-6 + bus / 80e9;
  const double ll128 = 20e-6 + 448 * 1e-6 + 63 * 5e-6 + bus / 40e9;
  ASSERT_LT(ll128, simple);  // small enough that the quick steps win
  EXPECT_CLOSE(s.collective_seconds(coll::Operation::allgather, "ring", GroupKind::hierarchical, 1e8, 512, 8), ll128);
  EXPECT_CLOSE(s.collective_seconds(coll::Operation::reduce_scatter, "ring", GroupKind::hierarchical, 1e8, 512, 8), ll128);
  // Large enough that bandwidth wins: the simple protocol.
  const double big = 1e11 * coll::bus_factor(coll::Operation::allgather, 512);
  EXPECT_CLOSE(s.collective_seconds(coll::Operation::allgather, "ring", GroupKind::hierarchical, 1e11, 512, 8),
               10e-6 + 448 * 4e-6 + 63 * 20e-6 + big / 80e9);
  // One member per node: every step crosses nodes, at one NIC's bandwidth, LL128 at its one-per-node factor.
  const double per_nic = 1e6 * coll::bus_factor(coll::Operation::allgather, 64);
  const double simple_64 = 10e-6 + 63 * 20e-6 + per_nic / 10e9, ll128_64 = 20e-6 + 63 * 5e-6 + per_nic / 2.5e9;
  ASSERT_LT(ll128_64, simple_64);
  EXPECT_CLOSE(s.collective_seconds(coll::Operation::allgather, "library", GroupKind::inter_node, 1e6, 64), ll128_64);
  // Never faster than the tiers' model: with a 100 us tier latency, two nodes of two ranks wait the tier's
  // 100 us, not the ring's 3 steps (38 us on simple, 27 us on LL128).
  System slow_tier = s;
  slow_tier.inter_node.latency.value = 100e-6;
  const double small = 1e3 * coll::bus_factor(coll::Operation::allgather, 4);
  EXPECT_CLOSE(slow_tier.collective_seconds(coll::Operation::allgather, "ring", GroupKind::hierarchical, 1e3, 4, 2),
               100e-6 + small / 20e9);
  // Allreduce, groups inside one node and Strata's own hierarchical algorithm are not rings of this model.
  const System plain = test_system();
  for (auto [op, algorithm, kind, ranks, per_node] :
       {std::tuple{coll::Operation::allreduce, "ring", GroupKind::hierarchical, 512, 8},
        std::tuple{coll::Operation::allgather, "ring", GroupKind::intra_node, 8, 8},
        std::tuple{coll::Operation::allgather, "hierarchical", GroupKind::hierarchical, 512, 8}})
    EXPECT_EQ(s.collective_seconds(op, algorithm, kind, 1e8, ranks, per_node),
              plain.collective_seconds(op, algorithm, kind, 1e8, ranks, per_node));
}

TEST(Simulate, UnfusedAttentionIsItsGemmsAndItsPassesOverTheScores) {
  const System s = test_system();
  Op forward = attention_op("a", 2, 4, 512, 512, 64, false, false, "bf16");
  forward.unfused = true;
  Op backward = forward;
  backward.backward = true;
  const Device& d = s.device;
  const double scores = 2.0 * 4 * 512 * 512;  // (b h, s_q, s_kv)
  const double qk = d.gemm_seconds("bf16", 8 * 512, 512, 64), pv = d.gemm_seconds("bf16", 8 * 512, 64, 512);
  EXPECT_CLOSE(compute_seconds(s, forward), qk + d.elementwise_seconds(4 * scores) + d.elementwise_seconds(5 * scores) + pv);
  EXPECT_CLOSE(compute_seconds(s, backward), qk + d.elementwise_seconds(5 * scores) + d.elementwise_seconds(6 * scores) +
                                                 pv + 2 * d.gemm_seconds("bf16", 8 * 512, 64, 512));
  // The mask is applied to the whole matrix: causal costs as much; a fused kernel skips the masked half.
  Op causal = forward;
  causal.causal = true;
  EXPECT_CLOSE(compute_seconds(s, causal), compute_seconds(s, forward));
  Op fused = causal;
  fused.unfused = false;
  EXPECT_LT(compute_seconds(s, fused), compute_seconds(s, causal));
}

TEST(Simulate, ANamedAttentionKernelRunsAtItsSpeedOfTheDescribedOne) {
  System s = test_system();
  s.device.kernel_overhead = Quantity{5e-6, 0, ""};
  s.device.attention_kernels["slow"] = {{0.8, 0, ""}, {0.4, 0, ""}};
  Op forward = attention_op("a", 2, 4, 512, 512, 64, true, false, "bf16");
  Op backward = forward;
  backward.backward = true;
  const double described_forward = compute_seconds(s, forward), described_backward = compute_seconds(s, backward);
  forward.attention_kernel = backward.attention_kernel = "slow";
  // The kernel's own time over its speed; the launch gap stays one gap.
  EXPECT_CLOSE(compute_seconds(s, forward), 5e-6 + (described_forward - 5e-6) / 0.8);
  EXPECT_CLOSE(compute_seconds(s, backward), 5e-6 + (described_backward - 5e-6) / 0.4);
  forward.attention_kernel = "missing";
  EXPECT_THROW(compute_seconds(s, forward), std::invalid_argument);
  // A workload's attention names the kernel; flash and unfused name none.
  for (auto [attention, kernel] : {std::pair{"flash", ""}, std::pair{"unfused", ""}, std::pair{"slow", "slow"}})
    EXPECT_EQ(attention_kernel(WorkloadOptions{"bf16", 2, attention}), kernel) << attention;
}

// ---- the JSON form --------------------------------------------------------------------------------------

TEST(SystemJson, RoundTripKeepsEveryFigureAndSource) {
  System s = test_system();
  s.comment = "made for a test";
  s.device.source = "a datasheet";
  s.intra_node.collectives[coll::Operation::reduce_scatter] = {{3e-6, 0.2, "assumed"}, {80e9, 0.1, "assumed"}};
  s.device.compute.at("bf16").peak_flops.value = 1.0 / 3.0 * 1e15;  // no short decimal form
  s.ring_latency = test_ring();
  s.ring_latency->source = "a library's tuning model";
  const auto text = system_to_json(s).dump(2);
  const System back = system_from_json(nlohmann::json::parse(text), "<test>");
  EXPECT_EQ(system_to_json(back).dump(2), text);
  ASSERT_TRUE(back.ring_latency.has_value());
  EXPECT_EQ(back.ring_latency->protocols.at("ll128").bandwidth_factor, 0.5);
  EXPECT_EQ(back.ring_latency->source, "a library's tuning model");
  EXPECT_EQ(back.device.compute.at("bf16").peak_flops.value, s.device.compute.at("bf16").peak_flops.value);
  EXPECT_EQ(back.intra_node.collectives.at(coll::Operation::reduce_scatter).latency.source, "assumed");
  EXPECT_EQ(back.device.compute.at("bf16").efficiency.points.size(), 2u);

  const auto path = std::filesystem::temp_directory_path() / ("strata-system-" + std::to_string(::getpid()) + ".json");
  strata::write_system(path.string(), s);
  const System from_file = strata::read_system(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(system_to_json(from_file).dump(), system_to_json(s).dump());
}

TEST(SystemJson, PlainNumbersAndCommentsAreAccepted) {
  auto doc = nlohmann::json(system_to_json(test_system()));
  doc["overlap_slowdown"] = 0.3;
  doc["_comment"] = "hand-edited";
  doc["device"]["_note"] = "ignored";
  EXPECT_DOUBLE_EQ(system_from_json(doc, "<test>").overlap_slowdown.value, 0.3);
}

TEST(SystemJson, MalformedInputNamesTheField) {
  const nlohmann::json good = system_to_json(test_system());
  auto expect_refused = [](const nlohmann::json& doc, const std::string& field) {
    try {
      system_from_json(doc, "<test>");
      ADD_FAILURE() << "accepted; expected a refusal naming " << field;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
  };
  nlohmann::json doc = good;
  doc["network"]["inter_node"]["bandwidth"]["value"] = -25e9;
  expect_refused(doc, "network.inter_node.bandwidth must be positive");
  System with_ring = test_system();
  with_ring.ring_latency = test_ring();
  const nlohmann::json ringed = system_to_json(with_ring);
  doc = ringed;
  doc["network"]["ring_latency"]["protocols"]["ll128"]["bandwidth_factor"] = 1.5;
  expect_refused(doc, "network.ring_latency.protocols.ll128.bandwidth_factor must be in (0, 1]");
  doc = ringed;
  doc["network"]["ring_latency"]["protocols"]["simple"]["inter_step"]["value"] = -1e-6;
  expect_refused(doc, "network.ring_latency.protocols.simple.inter_step must not be negative");
  doc = ringed;
  doc["network"]["ring_latency"]["protocols"]["simple"]["per_step"] = 1e-6;
  expect_refused(doc, "network.ring_latency.protocols.simple.per_step");
  doc = ringed;
  doc["network"]["ring_latency"]["protocols"] = nlohmann::json::object();
  expect_refused(doc, "network.ring_latency.protocols must name at least one protocol");
  doc = ringed;
  doc["network"]["ring_latency"]["protocols"]["ll128"]["bandwidth_factor_one_per_node"] = 0;
  expect_refused(doc, "network.ring_latency.protocols.ll128.bandwidth_factor_one_per_node must be in (0, 1]");
  doc = ringed;
  doc["version"] = 1;  // a version 2 field in a version 1 file
  expect_refused(doc, "network.ring_latency");
  doc = good;
  doc["network"]["inter_node"].erase("latency");
  expect_refused(doc, "network.inter_node.latency: missing");
  doc = good;
  doc["device"]["memory_bandwidth"] = "fast";
  expect_refused(doc, "device.memory_bandwidth: must be a number");
  doc = good;
  doc["device"]["compute"]["bf16"]["peak_flops"]["value"] = "312e12";
  expect_refused(doc, "device.compute.bf16.peak_flops.value: must be a number");
  doc = good;
  doc["device"]["compute"]["bf16"]["efficiency"]["points"][0] = {1e6};
  expect_refused(doc, "device.compute.bf16.efficiency.points[0]: must be a pair");
  doc = good;
  doc["network"]["intra_node"]["collectives"] = {{"allreduse", {{"latency", 1e-6}, {"bandwidth", 1e9}}}};
  expect_refused(doc, "network.intra_node.collectives.allreduse: unknown collective");
  doc = good;
  doc["device"]["memory_bandwith"] = 1e12;
  expect_refused(doc, "device.memory_bandwith: unknown field");
  doc = good;
  doc["version"] = 7;
  expect_refused(doc, "version: is 7");
  doc = good;
  doc["format"] = "something-else";
  expect_refused(doc, "format: must be");
  doc = good;
  doc["device"]["devices_per_node"] = 8.5;
  expect_refused(doc, "device.devices_per_node: must be an integer");
  doc = good;
  doc.erase("device");
  expect_refused(doc, "device: missing");

  const auto path = std::filesystem::temp_directory_path() / ("strata-bad-" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << "{\"format\": \"strata-system\", \"version\": 1,";
  EXPECT_THROW(strata::read_system(path.string()), std::invalid_argument);
  std::filesystem::remove(path);
  EXPECT_THROW(strata::read_system("/nonexistent/system.json"), std::invalid_argument);
}

TEST(SystemJson, TheSpecSheetSystemsLoadAndValidate) {
  for (const char* file : {"a100-80gb-sxm-hdr200.json", "a100-40gb-sxm-hdr200.json", "h100-sxm-ndr400.json"}) {
    SCOPED_TRACE(file);
    const System s = strata::read_system(std::string(STRATA_SYSTEMS_DIR) + "/" + file);
    EXPECT_EQ(s.device.devices_per_node, 8);
    ASSERT_TRUE(s.device.compute.count("bf16"));
    EXPECT_FALSE(s.device.compute.at("bf16").peak_flops.source.empty());
    EXPECT_FALSE(s.inter_node.bandwidth.source.empty());
    EXPECT_FALSE(s.inter_node.latency.source.empty());
    // An 8-GPU node moves bytes faster inside than between nodes.
    EXPECT_GT(s.intra_node.bandwidth.value, s.inter_node.bandwidth.value);
    // Version 2: every assumption beyond the datasheets says so.
    EXPECT_NE(s.inter_node.source.find("not measured"), std::string::npos);
    ASSERT_TRUE(s.collective_contention.has_value());
    EXPECT_NE(s.collective_contention->source.find("assumption"), std::string::npos);
    ASSERT_TRUE(s.communication_slowdown.has_value());
    EXPECT_NE(s.communication_slowdown->source.find("assumption"), std::string::npos);
    // The overlap slowdown is a published measurement, cited.
    EXPECT_NE(s.overlap_slowdown.source.find("published"), std::string::npos);
    EXPECT_NE(s.overlap_slowdown.source.find("arXiv"), std::string::npos);
  }
  const System a100 = strata::read_system(std::string(STRATA_SYSTEMS_DIR) + "/a100-80gb-sxm-hdr200.json");
  const System h100 = strata::read_system(std::string(STRATA_SYSTEMS_DIR) + "/h100-sxm-ndr400.json");
  EXPECT_DOUBLE_EQ(a100.device.compute.at("bf16").peak_flops.value, 312e12);
  EXPECT_DOUBLE_EQ(h100.device.compute.at("bf16").peak_flops.value, 989e12);
  // A NIC's measured bus bandwidth stays below its line rate (200 and 400 Gb/s: 25 and 50 GB/s).
  EXPECT_LT(a100.inter_node.bandwidth.value, 25e9);
  EXPECT_LT(h100.inter_node.bandwidth.value, 50e9);
}

// Every figure of the shipped descriptions says where it comes from, and every efficiency is a fraction of peak.
TEST(SystemJson, EveryShippedFigureHasASourceAndEveryEfficiencyIsAFraction) {
  for (const char* file : {"a100-80gb-sxm-hdr200.json", "a100-40gb-sxm-hdr200.json", "h100-sxm-ndr400.json"}) {
    SCOPED_TRACE(file);
    const System s = strata::read_system(std::string(STRATA_SYSTEMS_DIR) + "/" + file);
    auto sourced = [](const std::string& what, const std::string& source) {
      EXPECT_FALSE(source.empty()) << what << " has no source";
    };
    auto fractions = [](const std::string& what, const EfficiencyCurve& curve) {
      ASSERT_FALSE(curve.points.empty()) << what;
      for (const EfficiencyPoint& p : curve.points) {
        EXPECT_GT(p.efficiency, 0) << what;
        EXPECT_LE(p.efficiency, 1) << what;
      }
      // Between and beyond the points too: the curve is linear between them and constant outside.
      for (double x = curve.points.front().flops / 10; x <= curve.points.back().flops * 10; x *= 1.5) {
        EXPECT_GT(curve.at(x), 0) << what << " at " << x;
        EXPECT_LE(curve.at(x), 1) << what << " at " << x;
      }
    };
    sourced("device", s.device.source);
    for (const auto& [dtype, c] : s.device.compute) {
      sourced(dtype + ".peak_flops", c.peak_flops.source);
      sourced(dtype + ".efficiency", c.efficiency.source);
      fractions(dtype + ".efficiency", c.efficiency);
      for (const auto& [pass, curve] : c.attention_efficiency) {
        sourced(dtype + ".attention_efficiency." + pass, curve.source);
        fractions(dtype + ".attention_efficiency." + pass, curve);
      }
    }
    sourced("memory_bandwidth", s.device.memory_bandwidth.source);
    sourced("memory_efficiency", s.device.memory_efficiency.source);
    ASSERT_TRUE(s.device.memory_capacity.has_value());
    sourced("memory_capacity", s.device.memory_capacity->source);
    ASSERT_TRUE(s.device.kernel_overhead.has_value());
    sourced("kernel_overhead", s.device.kernel_overhead->source);
    for (const NetworkTier* tier : {&s.intra_node, &s.inter_node}) {
      sourced("tier", tier->source);
      sourced("tier bandwidth", tier->bandwidth.source);
      sourced("tier latency", tier->latency.source);
    }
    for (const CollectiveModel& m : s.collectives) sourced(std::string("collective ") + std::string(coll::name(m.op)), m.source);
    ASSERT_TRUE(s.collective_contention && s.communication_slowdown);
    sourced("collective_contention", s.collective_contention->source);
    sourced("overlap_slowdown", s.overlap_slowdown.source);
    sourced("communication_slowdown", s.communication_slowdown->source);
    // The NCCL sweep's ranges join: no size takes less time than a smaller one inside the measured range.
    for (const CollectiveModel& m : s.collectives) {
      double before = 0;
      for (double bytes = 1024; bytes <= 32e9; bytes *= 1.25) {
        const double t = m.seconds(bytes, m.ranks);
        EXPECT_GE(t, before * (1 - 1e-9)) << coll::name(m.op) << " at " << bytes << " B";
        before = t;
      }
    }
  }
}

// A flash-attention curve over seq_kv reads its efficiency at the keys' sequence length, whatever the batch; the
// kernel overhead adds to each kernel; a GEMM curve over seq_kv is refused.
TEST(SystemDescription, AttentionCurvesOverTheSequenceAndTheKernelOverhead) {
  System s = test_system();
  s.device.compute["bf16"].attention_efficiency["fwd"] = {{{1024, 0.2}, {4096, 0.4}}, 0, "test", "seq_kv"};
  const AttentionShape small{1, 8, 8, 2048, 2048, 128, true, false};
  AttentionShape large = small;
  large.batch = 64;
  const double at_2048 = 0.3;  // half-way in log2 between 1024 and 4096
  EXPECT_CLOSE(s.device.attention_seconds("bf16", small), small.flops() / (100e12 * at_2048));
  EXPECT_CLOSE(s.device.attention_seconds("bf16", large), large.flops() / (100e12 * at_2048));
  EXPECT_FALSE(find_problem(s).has_value());

  const double gemm = s.device.gemm_seconds("bf16", 4096, 4096, 4096);
  const double ew = s.device.elementwise_seconds("gelu", 8e9);
  s.device.kernel_overhead = Quantity{5e-6, 0.5, "test"};
  EXPECT_CLOSE(s.device.gemm_seconds("bf16", 4096, 4096, 4096), gemm + 5e-6);
  EXPECT_CLOSE(s.device.elementwise_seconds("gelu", 8e9), ew + 5e-6);
  EXPECT_CLOSE(s.device.attention_seconds("bf16", small), 5e-6 + small.flops() / (100e12 * at_2048));
  EXPECT_CLOSE(simulate(s, {{}, {{0, 1, {gemm_op("mm", 4096, 4096, 4096, "bf16")}}}}).step_s, gemm + 5e-6);

  const auto path = std::filesystem::temp_directory_path() / ("strata-over-" + std::to_string(::getpid()) + ".json");
  strata::write_system(path.string(), s);
  const System back = strata::read_system(path.string());
  std::filesystem::remove(path);
  EXPECT_EQ(back.device.compute.at("bf16").attention_efficiency.at("fwd").over, "seq_kv");
  ASSERT_TRUE(back.device.kernel_overhead.has_value());
  EXPECT_DOUBLE_EQ(back.device.kernel_overhead->value, 5e-6);

  s.device.kernel_overhead = Quantity{-1e-6, 0, "test"};
  ASSERT_TRUE(find_problem(s).has_value());
  EXPECT_NE(find_problem(s)->find("device.kernel_overhead"), std::string::npos);
  s.device.kernel_overhead.reset();
  s.device.compute["bf16"].efficiency.over = "seq_kv";
  ASSERT_TRUE(find_problem(s).has_value());
  EXPECT_NE(find_problem(s)->find("device.compute.bf16.efficiency.over"), std::string::npos);
}

// ---- the simulator --------------------------------------------------------------------------------------

Workload one_rank(std::vector<Op> ops) { return {{}, {{0, 1, std::move(ops)}}}; }

TEST(Simulate, OneGemmTakesFlopsOverPeakTimesEfficiency) {
  const System s = test_system();
  // 2 * 4096^3 = 1.37e11 FLOPs, above the curve's last point: 50% of 100 TFLOP/s.
  const Timeline t = simulate(s, one_rank({gemm_op("mm", 4096, 4096, 4096, "bf16")}));
  EXPECT_CLOSE(t.step_s, 2.0 * 4096 * 4096 * 4096 / (100e12 * 0.5));
  EXPECT_CLOSE(t.breakdown[0].compute_s, t.step_s);
  // 2 * 200^3 = 1.6e7 FLOPs: log10(16) of the three decades from 1e6 to 1e9 up the curve.
  const double flops = 1.6e7;
  const double efficiency = 0.25 + 0.25 * std::log10(flops / 1e6) / 3;
  EXPECT_CLOSE(simulate(s, one_rank({gemm_op("small", 200, 200, 200, "bf16")})).step_s,
               flops / (100e12 * efficiency));
  // 100^3 is memory-bound on the roofline: A, W and C, 3e4 bf16 elements, at 0.8 TB/s take 75 ns, longer than
  // its 2e6 FLOPs at efficiency 0.25 + 0.25 log10(2) / 3 (72.7 ns).
  EXPECT_CLOSE(simulate(s, one_rank({gemm_op("tiny", 100, 100, 100, "bf16")})).step_s, 3e4 * 2 / 0.8e12);
  // Attention: causal forward 4 b h s s d / 2, backward 2.5 times that; elementwise bytes / (1 TB/s * 0.8).
  const Op fwd = attention_op("attn", 2, 16, 2048, 2048, 128, true, false, "bf16");
  EXPECT_DOUBLE_EQ(attention_flops(fwd), 4.0 * 2 * 16 * 2048 * 2048 * 128 / 2);
  const Op bwd = attention_op("attn_bwd", 2, 16, 2048, 2048, 128, true, true, "bf16");
  EXPECT_DOUBLE_EQ(attention_flops(bwd), 2.5 * attention_flops(fwd));
  EXPECT_CLOSE(simulate(s, one_rank({elementwise_op("gelu", 8e9)})).step_s, 8e9 / 0.8e12);
  EXPECT_THROW(simulate(s, one_rank({gemm_op("mm", 64, 64, 64, "fp8")})), std::invalid_argument);
}

// n ranks, each one allreduce of `bytes` on group 0; the last rank computes for `last_rank_compute` s first.
Workload allreduce_workload(int n, double bytes, double last_rank_compute = 0) {
  Workload w;
  Group g{0, {}};
  for (int r = 0; r < n; ++r) {
    g.ranks.push_back(r);
    std::vector<Op> ops;
    Op allreduce = collective_op("ar", coll::Operation::allreduce, 0, bytes);
    if (r == n - 1 && last_rank_compute > 0) {
      ops.push_back(timed_op("late", last_rank_compute));
      allreduce.depends_on = {0};  // its input: on another stream, only a dependency orders them
    }
    ops.push_back(allreduce);
    w.ranks.push_back({r, 1, ops});
  }
  w.groups.push_back(g);
  return w;
}

TEST(Simulate, AnAllreduceTakesAlphaPlusBusBytesOverBandwidth) {
  const System s = test_system();
  const double bytes = 1 << 30;
  for (int n : {2, 4, 8}) {  // one node: the intra-node tier
    const Timeline t = simulate(s, allreduce_workload(n, bytes));
    EXPECT_CLOSE(t.step_s, 2e-6 + 2.0 * (n - 1) / n * bytes / 100e9);
    EXPECT_CLOSE(t.breakdown[0].exposed_communication_s.at(0), t.step_s);
  }
  // 16 ranks span two nodes of 8: the inter-node tier's latency, and its 10 GB/s on each of the 8 members' links at
  // once (80 GB/s, below the intra-node link's 100).
  EXPECT_CLOSE(simulate(s, allreduce_workload(16, bytes)).step_s, 10e-6 + 2.0 * 15 / 16 * bytes / 80e9);
}

TEST(Simulate, ACollectiveWaitsForItsLastRankAndEndsTogether) {
  const System s = test_system();
  const double bytes = 1e9, late = 0.5;
  const Timeline t = simulate(s, allreduce_workload(4, bytes, late));
  const double allreduce = 2e-6 + 1.5 * bytes / 100e9;
  EXPECT_CLOSE(t.step_s, late + allreduce);
  for (int r = 0; r < 4; ++r) {
    const OpTiming& ar = t.ops[static_cast<size_t>(r)].back();
    EXPECT_CLOSE(ar.start, late);
    EXPECT_CLOSE(ar.end, late + allreduce);
  }
  EXPECT_EQ(t.ops[0][0].reached, 0);  // rank 0 reached it at once and waited
  EXPECT_CLOSE(t.breakdown[0].idle_s, late);
  EXPECT_CLOSE(t.breakdown[0].exposed_communication_s.at(0), allreduce);
  EXPECT_CLOSE(t.breakdown[3].compute_s, late);
}

// A p-stage pipeline with m micro-batches and zero-cost transfers, forward tf and backward tb per stage.
// GPipe: every forward, then every backward. 1F1B: p - 1 - stage forwards, then one forward one backward.
Workload pipeline(int p, int m, double tf, double tb, bool one_f_one_b) {
  Workload w;
  for (int stage = 0; stage < p; ++stage) {
    std::vector<Op> ops;
    auto forward = [&](int i) {
      if (stage > 0) ops.push_back(recv_op("recv act " + std::to_string(i), stage - 1, 0));
      ops.push_back(timed_op("F" + std::to_string(i), tf));
      if (stage < p - 1) ops.push_back(send_op("send act " + std::to_string(i), stage + 1, 0));
    };
    auto backward = [&](int i) {
      if (stage < p - 1) ops.push_back(recv_op("recv grad " + std::to_string(i), stage + 1, 0));
      ops.push_back(timed_op("B" + std::to_string(i), tb));
      if (stage > 0) ops.push_back(send_op("send grad " + std::to_string(i), stage - 1, 0));
    };
    if (one_f_one_b) {
      const int warmup = std::min(m, p - 1 - stage);
      for (int i = 0; i < warmup; ++i) forward(i);
      for (int i = 0; i < m - warmup; ++i) {
        forward(warmup + i);
        backward(i);
      }
      for (int i = m - warmup; i < m; ++i) backward(i);
    } else {
      for (int i = 0; i < m; ++i) forward(i);
      for (int i = m - 1; i >= 0; --i) backward(i);
    }
    w.ranks.push_back({stage, 1, ops});
  }
  return w;
}

TEST(Simulate, APipelineMatchesTheGpipeAnd1f1bClosedForm) {
  System s = test_system();
  s.intra_node.latency.value = 0;  // zero-cost sends: zero bytes, zero latency
  const double tf = 1e-3, tb = 2e-3;
  for (bool one_f_one_b : {false, true}) {
    for (auto [p, m] : {std::pair{2, 1}, {2, 4}, {2, 8}, {4, 8}, {4, 16}}) {
      SCOPED_TRACE((one_f_one_b ? "1F1B p=" : "GPipe p=") + std::to_string(p) + " m=" + std::to_string(m));
      const Timeline t = simulate(s, pipeline(p, m, tf, tb, one_f_one_b));
      EXPECT_CLOSE(t.step_s, (p - 1 + m) * (tf + tb));
      for (const Breakdown& b : t.breakdown) {
        EXPECT_CLOSE(b.compute_s, m * (tf + tb));
        EXPECT_CLOSE(b.idle_s / b.compute_s, (p - 1.0) / m);  // the bubble fraction
      }
    }
  }
}

TEST(Simulate, ARecvEndsAfterTheTransferOfItsSend) {
  const System s = test_system();  // ranks 0 and 8: different nodes
  Workload w;
  w.ranks.push_back({0, 1, {timed_op("work", 1e-3), send_op("send", 8, 1e8)}});
  w.ranks.push_back({8, 1, {recv_op("recv", 0, 1e8), timed_op("consume", 1e-3)}});
  const Timeline t = simulate(s, w);
  const double transfer = 10e-6 + 1e8 / 10e9;
  EXPECT_CLOSE(t.ops[1][0].end, 1e-3 + transfer);
  EXPECT_CLOSE(t.step_s, 2e-3 + transfer);
  EXPECT_CLOSE(t.breakdown[1].idle_s, 1e-3);
  EXPECT_CLOSE(t.breakdown[1].exposed_communication_s.at(kPointToPoint), transfer);

  // Posted while the data is on the way: it still ends when the transfer does. Posted after: at once.
  for (double posted : {1e-3 + transfer / 2, 1e-3 + 2 * transfer}) {
    Workload late = w;
    late.ranks[1].ops.insert(late.ranks[1].ops.begin(), timed_op("before", posted));
    const Timeline u = simulate(s, late);
    EXPECT_CLOSE(u.ops[1][1].end, std::max(posted, 1e-3 + transfer));
  }
}

// One rank standing for a group of 2 (so the allreduce costs something): a compute op of t_alone on the
// compute stream and an allreduce of `allreduce_s` beside it, both starting at 0.
Timeline overlap(double t_alone, double allreduce_s, double s_slowdown) {
  System s = test_system();
  s.overlap_slowdown.value = s_slowdown;
  s.intra_node.latency.value = 0;
  const double bytes = allreduce_s * s.intra_node.bandwidth.value;  // bus factor 1 with n = 2
  Workload w{{{0, {0, 1}}}, {{0, 2, {timed_op("mm", t_alone), collective_op("ar", coll::Operation::allreduce, 0, bytes)}}}};
  return simulate(s, w);
}

TEST(Simulate, OverlapSlowsTheOverlappedFractionByEchosForm) {
  const double t = 1e-3, s = 0.25;
  // Fully overlapped: the allreduce outlasts the slowed GEMM.
  Timeline full = overlap(t, 2e-3, s);
  EXPECT_CLOSE(full.ops[0][0].end, t * (1 + s));
  EXPECT_CLOSE(full.step_s, 2e-3);
  // Half of its work overlapped: the allreduce ends after 0.5 t (1 + s) of wall time.
  Timeline half = overlap(t, 0.5 * t * (1 + s), s);
  EXPECT_CLOSE(half.ops[0][0].end, t * ((1 - 0.5) + 0.5 * (1 + s)));
  // A fifth: r = 0.2.
  Timeline fifth = overlap(t, 0.2 * t * (1 + s), s);
  EXPECT_CLOSE(fifth.ops[0][0].end, t * ((1 - 0.2) + 0.2 * (1 + s)));
  // No slowdown: the two run side by side unharmed.
  EXPECT_CLOSE(overlap(t, 0.5e-3, 0).ops[0][0].end, t);
  // The overlapped wall time is compute, not exposed communication.
  EXPECT_CLOSE(full.breakdown[0].compute_s + full.breakdown[0].exposed_communication_s.at(0) + full.breakdown[0].idle_s,
               full.step_s);
  EXPECT_CLOSE(full.breakdown[0].compute_s, t * (1 + s));
}

TEST(Simulate, OverlapStartingMidwayCountsOnlyTheOverlappedWork) {
  // The allreduce starts after a 0.4 ms op on its own stream, while a 1 ms GEMM runs: 0.4 ms alone, then slowed
  // until the allreduce ends at 0.4 + 0.3 ms (0.3 / 1.25 = 0.24 ms of work), then alone again for 0.36 ms.
  System s = test_system();
  s.intra_node.latency.value = 0;
  const double slow = 0.25;
  s.overlap_slowdown.value = slow;
  const double bytes = 0.3e-3 * s.intra_node.bandwidth.value;
  Op ar = collective_op("ar", coll::Operation::allreduce, 0, bytes);
  ar.depends_on = {1};
  Workload w{{{0, {0, 1}}}, {{0, 2, {timed_op("mm", 1e-3), timed_op("pre", 0.4e-3, 5), ar}}}};
  const Timeline t = simulate(s, w);
  const double r = (0.3e-3 / (1 + slow)) / 1e-3;
  EXPECT_CLOSE(t.ops[0][0].end, 1e-3 * ((1 - r) + r * (1 + slow)));
}

// The test system with overlap slowdown s and communication slowdown c, its intra-node tier without latency (an
// allreduce of two ranks then takes bytes / bandwidth).
System slowed_both_ways(double s_slowdown, double c) {
  System s = test_system();
  s.overlap_slowdown.value = s_slowdown;
  s.communication_slowdown = Quantity{c, 0, "test"};
  s.intra_node.latency.value = 0;
  return s;
}

SimulateOptions by(SimulateMethod method) {
  SimulateOptions options;
  options.method = method;
  return options;
}

// As overlap(), with the communication slowdown c: the allreduce does its work at 1 / (1 + c) while the GEMM runs.
Timeline slowed_communication(double t_alone, double allreduce_s, double s_slowdown, double c, SimulateMethod method) {
  const System s = slowed_both_ways(s_slowdown, c);
  const double bytes = allreduce_s * s.intra_node.bandwidth.value;  // bus factor 1 with n = 2
  Workload w{{{0, {0, 1}}}, {{0, 2, {timed_op("mm", t_alone), collective_op("ar", coll::Operation::allreduce, 0, bytes)}}}};
  return simulate(s, w, by(method));
}

TEST(Simulate, ACollectiveBesideComputeIsSlowedByTheCommunicationSlowdown) {
  for (SimulateMethod method : {SimulateMethod::event_queue, SimulateMethod::scan}) {
    // 1 ms of allreduce beside 1 ms of GEMM, c = 1: half its work in the GEMM's millisecond, the rest alone.
    Timeline t = slowed_communication(1e-3, 1e-3, 0, 1, method);
    EXPECT_CLOSE(t.ops[0][0].end, 1e-3);
    EXPECT_CLOSE(t.ops[0][1].end, 1.5e-3);
    // Both slowed at once: the GEMM (s = 0.25) ends at 1.25 ms with 0.625 ms of the allreduce done; 0.375 ms after.
    t = slowed_communication(1e-3, 1e-3, 0.25, 1, method);
    EXPECT_CLOSE(t.ops[0][0].end, 1.25e-3);
    EXPECT_CLOSE(t.ops[0][1].end, 1.625e-3);
    // A short allreduce ends inside the GEMM, at twice its time alone.
    EXPECT_CLOSE(slowed_communication(1e-3, 0.2e-3, 0, 1, method).ops[0][1].end, 0.4e-3);
    // A GEMM that ends first: 0.3 ms at half rate, then 0.85 ms alone.
    EXPECT_CLOSE(slowed_communication(0.3e-3, 1e-3, 0, 1, method).ops[0][1].end, 1.15e-3);
    // No communication slowdown: the allreduce takes its time alone.
    EXPECT_CLOSE(slowed_communication(1e-3, 1e-3, 0, 0, method).ops[0][1].end, 1e-3);
  }
}

TEST(Simulate, ACollectiveIsSlowedWhileAnyMemberComputes) {
  // Two traced ranks: rank 0 computes for 1 ms beside the allreduce, rank 1 only reaches it. Both members end it
  // together, slowed for the millisecond rank 0 computes.
  const System s = slowed_both_ways(0, 1);
  const double bytes = 1e-3 * s.intra_node.bandwidth.value;
  const Op ar = collective_op("ar", coll::Operation::allreduce, 0, bytes);
  Workload w{{{0, {0, 1}}}, {{0, 1, {timed_op("mm", 1e-3), ar}}, {1, 1, {ar}}}};
  for (SimulateMethod method : {SimulateMethod::event_queue, SimulateMethod::scan}) {
    const Timeline t = simulate(s, w, by(method));
    EXPECT_CLOSE(t.ops[0][1].end, 1.5e-3);
    EXPECT_CLOSE(t.ops[1][0].end, 1.5e-3);
    EXPECT_CLOSE(t.breakdown[1].exposed_communication_s.at(0), 1.5e-3);
  }
}

TEST(Simulate, ACollectiveSlowsWhenAMemberStartsComputingAfterIt) {
  // Rank 0's GEMM waits for a 0.5 ms transfer from rank 1, so the 0.8 ms allreduce runs alone for 0.5 ms, then at
  // half rate (c = 1) for its last 0.3 ms of work: it ends at 1.1 ms. A reused simulation without the slowdown gives
  // the allreduce its 0.8 ms, and with it again 1.1 ms.
  const System s = slowed_both_ways(0, 1);
  const double transfer = 0.5e-3 * s.intra_node.bandwidth.value;
  const Op ar = collective_op("ar", coll::Operation::allreduce, 0, 0.8e-3 * s.intra_node.bandwidth.value);
  Workload w{{{0, {0, 1}}},
             {{0, 1, {recv_op("in", 1, transfer), timed_op("mm", 1e-3), ar}}, {1, 1, {send_op("out", 0, transfer), ar}}}};
  for (SimulateMethod method : {SimulateMethod::event_queue, SimulateMethod::scan}) {
    const SimulateOptions options = by(method);
    const Timeline t = simulate(s, w, options);
    EXPECT_CLOSE(t.ops[0][1].start, 0.5e-3);
    EXPECT_CLOSE(t.ops[0][2].end, 1.1e-3);
    EXPECT_CLOSE(t.ops[1][1].end, 1.1e-3);
    Simulation reused(s, w);
    System unslowed = s;
    unslowed.communication_slowdown.reset();
    EXPECT_CLOSE(reused.run(s, options).ops[0][2].end, 1.1e-3);
    EXPECT_CLOSE(reused.run(unslowed, options).ops[0][2].end, 0.8e-3);
    EXPECT_CLOSE(reused.run(s, options).ops[1][1].end, 1.1e-3);
  }
}

TEST(Simulate, DependenciesAndStreamOrder) {
  const System s = test_system();
  // A on the compute stream and B on stream 3 run side by side; C on the compute stream waits for B; D on stream
  // 3 waits for B by stream order only.
  Op c = timed_op("C", 1.0);
  c.depends_on = {1};
  const Timeline t = simulate(s, one_rank({timed_op("A", 1.0), timed_op("B", 2.0, 3), c, timed_op("D", 0.5, 3)}));
  EXPECT_EQ(t.ops[0][0].start, 0);
  EXPECT_EQ(t.ops[0][1].start, 0);
  EXPECT_CLOSE(t.ops[0][2].start, 2.0);
  EXPECT_CLOSE(t.ops[0][3].start, 2.0);
  EXPECT_CLOSE(t.step_s, 3.0);
  EXPECT_EQ(t.intervals.size(), 4u);
  // The same ops without the dependency: C follows A on its stream.
  EXPECT_CLOSE(simulate(s, one_rank({timed_op("A", 1.0), timed_op("B", 2.0, 3), timed_op("C", 1.0)})).ops[0][2].start,
               1.0);
  // A dependency on a later op, or on itself, is refused.
  Op bad = timed_op("bad", 1.0);
  bad.depends_on = {0};
  EXPECT_THROW(simulate(s, one_rank({bad})), std::invalid_argument);
}

TEST(Simulate, TheTimelineBecomesAChromeTrace) {
  Op c = timed_op("C", 1e-3);
  c.depends_on = {1};
  const Timeline t = simulate(test_system(), one_rank({timed_op("A", 1e-3), timed_op("B", 2e-3, 3), c}));
  const nlohmann::json trace = strata::timeline_to_chrome_trace(t);
  std::vector<nlohmann::json> spans;
  for (const auto& e : trace.at("traceEvents"))
    if (e.at("ph") == "X") spans.push_back(e);
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[2].at("name"), "C");
  EXPECT_EQ(spans[2].at("tid"), kComputeStream);
  EXPECT_EQ(spans[1].at("tid"), 3);
  EXPECT_NEAR(spans[2].at("ts").get<double>(), 2000, 1e-9);  // microseconds
  EXPECT_NEAR(spans[2].at("dur").get<double>(), 1000, 1e-9);
}

TEST(Simulate, SymmetryWeightsDoNotChangeTheTime) {
  const System s = test_system();
  auto graph = [](int rank) {
    Op allreduce = collective_op("ar", coll::Operation::allreduce, 0, 1e8);
    allreduce.depends_on = {0};
    Op optimizer = timed_op("opt", 1e-3);
    optimizer.depends_on = {1};
    return RankGraph{rank, 1, {timed_op("fwd", 2e-3), allreduce, optimizer}};
  };
  Workload all{{{0, {0, 1, 2, 3}}}, {}};
  for (int r = 0; r < 4; ++r) all.ranks.push_back(graph(r));
  Workload one{{{0, {0, 1, 2, 3}}}, {graph(0)}};
  one.ranks[0].weight = 4;
  const Timeline a = simulate(s, all), b = simulate(s, one);
  EXPECT_EQ(a.step_s, b.step_s);
  EXPECT_CLOSE(b.step_s, 3e-3 + 2e-6 + 1.5 * 1e8 / 100e9);
  EXPECT_EQ(a.mean.compute_s, b.mean.compute_s);
  EXPECT_EQ(a.mean.exposed_communication_s.at(0), b.mean.exposed_communication_s.at(0));
}

TEST(Simulate, TheMeanBreakdownWeighsRanksByWhatTheyStandFor) {
  const System s = test_system();
  Workload w;
  w.ranks.push_back({0, 3, {timed_op("long", 4.0)}});
  w.ranks.push_back({1, 1, {timed_op("short", 2.0)}});
  const Timeline t = simulate(s, w);
  EXPECT_DOUBLE_EQ(t.mean.compute_s, (3 * 4.0 + 2.0) / 4);
  EXPECT_DOUBLE_EQ(t.mean.idle_s, (0 + 2.0) / 4);
}

TEST(Simulate, BadWorkloadsAreRefused) {
  const System s = test_system();
  auto refused = [&](const Workload& w, const std::string& words) {
    try {
      simulate(s, w);
      ADD_FAILURE() << "accepted; expected a refusal with " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  // Two ranks each waiting for the other's data.
  refused({{}, {{0, 1, {recv_op("r", 1, 8), send_op("s", 1, 8)}}, {1, 1, {recv_op("r", 0, 8), send_op("s", 0, 8)}}}},
          "deadlocks");
  // Collectives that differ across the group.
  refused({{{0, {0, 1}}},
           {{0, 1, {collective_op("ar", coll::Operation::allreduce, 0, 8)}},
            {1, 1, {collective_op("ag", coll::Operation::allgather, 0, 8)}}}},
          "collective #0");
  refused({{}, {{0, 1, {collective_op("ar", coll::Operation::allreduce, 4, 8)}}}}, "group 4, unknown");
  refused({{{0, {1, 2}}}, {{0, 1, {collective_op("ar", coll::Operation::allreduce, 0, 8)}}}}, "not a member");
  refused({{}, {{0, 1, {send_op("s", 1, 8)}}, {1, 1, {}}}}, "sends 1 times to rank 1");
  refused({{}, {{0, 1, {send_op("s", 5, 8)}}}}, "not another traced rank");
  refused({{}, {{0, 1, {timed_op("neg", -1)}}}}, "negative");
  System bad = s;
  bad.inter_node.bandwidth.value = 0;
  EXPECT_THROW(simulate(bad, one_rank({timed_op("x", 1)})), std::invalid_argument);
}

}  // namespace
}  // namespace strata::project
