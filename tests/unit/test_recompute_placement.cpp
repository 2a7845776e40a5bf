// The placement of overlapped recomputation (train/recompute_placement.h): GLPK's optimum against exhaustive
// enumeration, the heuristic against the optimum, each constraint binding in a case built by hand, the
// validator, and the policy file (bench/cases/recompute_policy.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "bench/harness/check.h"
#include "bench/cases/recompute_policy.h"
#include "train/recompute_placement.h"

namespace strata::train {
namespace {

constexpr double kMs = 1e-3;
constexpr double kMiB = 1 << 20;

unsigned test_seed() {
  const char* from_env = std::getenv("STRATA_TEST_SEED");
  const unsigned seed = from_env ? static_cast<unsigned>(std::strtoul(from_env, nullptr, 10)) : 20240611u;
  std::printf("recompute placement: seed %u (set STRATA_TEST_SEED to change it)\n", seed);
  return seed;
}

RecomputableOp op(std::string name, int layer, double time_ms, double mib, int earliest, int deadline,
                  std::vector<int> producers = {}) {
  // Held from the first window it may use; cases that hold it longer set forward_window.
  return {std::move(name), layer, time_ms * kMs, mib * kMiB, earliest, earliest, deadline, std::move(producers)};
}

// Every placement of a small problem, the valid ones compared by (exposure, kept bytes).
struct Best {
  double exposed_s = INFINITY, kept_bytes = INFINITY;
};
Best exhaustive(const PlacementProblem& problem) {
  Best best;
  Placement placement(problem.ops.size());
  std::function<void(size_t)> visit = [&](size_t i) {
    if (i == problem.ops.size()) {
      if (find_violation(problem, placement)) return;
      const double exposed = exposed_recompute_s(problem, placement), kept = kept_bytes(problem, placement);
      if (exposed < best.exposed_s - 1e-12 || (exposed <= best.exposed_s + 1e-12 && kept < best.kept_bytes)) {
        best.exposed_s = exposed;
        best.kept_bytes = kept;
      }
      return;
    }
    placement[i] = {RecomputeMode::keep, -1};
    visit(i + 1);
    placement[i] = {RecomputeMode::on_demand, -1};
    visit(i + 1);
    for (int w = problem.ops[i].earliest_window; w < problem.ops[i].deadline_window; ++w) {
      placement[i] = {RecomputeMode::window, w};
      visit(i + 1);
    }
  };
  visit(0);
  return best;
}

PlacementProblem random_problem(std::mt19937& rng) {
  std::uniform_int_distribution<int> window_count(1, 3), op_count(1, 5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  PlacementProblem problem;
  const int windows = window_count(rng);
  double base_max = 0;
  for (int w = 0; w < windows; ++w) {
    const double base = std::floor(unit(rng) * 4) * kMiB;
    problem.windows.push_back({"w" + std::to_string(w), (0.5 + 12 * unit(rng)) * kMs, base});
    base_max = std::max(base_max, base);
  }
  const int ops = op_count(rng);
  double total_bytes = 0;
  for (int i = 0; i < ops; ++i) {
    const int earliest = std::uniform_int_distribution<int>(0, windows)(rng);
    const int deadline = std::uniform_int_distribution<int>(earliest, windows)(rng);
    RecomputableOp o = op("op" + std::to_string(i), i % 2, 1 + 9 * unit(rng), 1 + std::floor(8 * unit(rng)),
                          earliest, deadline);
    o.forward_window = std::uniform_int_distribution<int>(0, earliest)(rng);
    for (int j = 0; j < i; ++j)
      if (problem.ops[j].deadline_window >= deadline && unit(rng) < 0.4) o.producers.push_back(j);
    total_bytes += o.output_bytes;
    problem.ops.push_back(o);
  }
  problem.slowdown = 1 + 0.5 * unit(rng);
  problem.memory_limit_bytes = base_max + std::floor(unit(rng) * total_bytes / kMiB) * kMiB;
  return problem;
}

void expect_same(double a, double b) { EXPECT_NEAR(a, b, 1e-9 * std::max(std::fabs(b), 1e-6)); }

TEST(RecomputePlacement, OptimalEqualsExhaustiveEnumeration) {
  std::mt19937 rng(test_seed());
  for (int instance = 0; instance < 150; ++instance) {
    SCOPED_TRACE("instance " + std::to_string(instance));
    const PlacementProblem problem = random_problem(rng);
    const Best best = exhaustive(problem);
    const PlacementResult optimal = solve_optimal(problem);
    EXPECT_FALSE(find_violation(problem, optimal.placement).has_value());
    EXPECT_TRUE(optimal.proven_optimal);
    expect_same(optimal.exposed_s, best.exposed_s);
    expect_same(optimal.kept_bytes, best.kept_bytes);  // the tie-break: fewest kept bytes
    EXPECT_GE(optimal.search_s, 0.0);

    const PlacementResult heuristic = solve_heuristic(problem);
    EXPECT_FALSE(find_violation(problem, heuristic.placement).has_value());
    EXPECT_GE(heuristic.exposed_s, optimal.exposed_s - 1e-12);
    EXPECT_GE(heuristic_gap(heuristic, optimal), -1e-9);
  }
}

// L identical blocks, each with its own windows: an op may use only the windows of the backward just before
// its block's, so nothing of one block is held at another's check points and the problem splits into equal
// per-block problems, whose pattern is then globally optimal.
PlacementProblem independent_blocks(int layers, const std::vector<RecomputableOp>& block,
                                    const std::vector<double>& capacities_s, double slowdown, double budget_bytes) {
  PlacementProblem problem;
  const int per_block = static_cast<int>(capacities_s.size());
  for (int n = 0; n < layers; ++n) {
    const int layer = layers - 1 - n;  // backward runs from the last layer down
    for (int w = 0; w < per_block; ++w)
      problem.windows.push_back({"tp bwd L" + std::to_string(layer + 1) + "." + std::to_string(w), capacities_s[w],
                                 3 * kMiB});
  }
  for (int layer = 0; layer < layers; ++layer) {
    const int first = (layers - 1 - layer) * per_block;
    const int offset = static_cast<int>(problem.ops.size());
    for (const RecomputableOp& o : block) {
      RecomputableOp copy = o;
      copy.name = "L" + std::to_string(layer) + "." + o.name;
      copy.layer = layer;
      copy.forward_window = first + o.forward_window;
      copy.earliest_window = first + o.earliest_window;
      copy.deadline_window = first + o.deadline_window;
      for (int& p : copy.producers) p += offset;
      problem.ops.push_back(copy);
    }
  }
  problem.slowdown = slowdown;
  problem.memory_limit_bytes = 3 * kMiB + budget_bytes;
  return problem;
}

TEST(RecomputePlacement, HeuristicEqualsOptimumOnIndependentIdenticalBlocks) {
  // By hand: window 0 fits one of a and b, window 1 fits b and c together, but 2 MiB at window 1's end is
  // all the memory: a in window 0 and b in window 1 leave c (0.5 ms) on demand in every block.
  const std::vector<RecomputableOp> block = {op("a", 0, 1.0, 1, 0, 2), op("b", 0, 1.0, 1, 0, 2, {0}),
                                             op("c", 0, 0.5, 2, 0, 2, {1})};
  const PlacementProblem problem = independent_blocks(6, block, {1.0 * kMs, 1.5 * kMs}, 1.0, 2 * kMiB);
  const PlacementResult optimal = solve_optimal(problem);
  const PlacementResult heuristic = solve_heuristic(problem);
  expect_same(optimal.exposed_s, 6 * 0.5 * kMs);
  expect_same(heuristic.exposed_s, optimal.exposed_s);
  expect_same(heuristic.kept_bytes, optimal.kept_bytes);
  EXPECT_EQ(heuristic.identical_block_classes, 1);
  EXPECT_EQ(heuristic_gap(heuristic, optimal), 0.0);
  EXPECT_EQ(heuristic.placement[0], (OpPlacement{RecomputeMode::window, 5 * 2}));  // L0.a in its first window

  std::mt19937 rng(test_seed() + 1);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  for (int instance = 0; instance < 30; ++instance) {
    SCOPED_TRACE("random block " + std::to_string(instance));
    std::vector<RecomputableOp> random_block;
    for (int k = 0; k < 4; ++k) {
      RecomputableOp o = op("op" + std::to_string(k), 0, 0.5 + 2 * unit(rng), 1 + std::floor(4 * unit(rng)),
                            unit(rng) < 0.3 ? 1 : 0, 2);
      if (k > 0 && unit(rng) < 0.5) o.producers.push_back(k - 1);
      random_block.push_back(o);
    }
    const PlacementProblem random = independent_blocks(
        4, random_block, {3 * unit(rng) * kMs, 3 * unit(rng) * kMs}, 1 + unit(rng), std::floor(8 * unit(rng)) * kMiB);
    const PlacementResult best = solve_optimal(random);
    const PlacementResult pattern = solve_heuristic(random);
    EXPECT_EQ(pattern.identical_block_classes, 1);
    expect_same(pattern.exposed_s, best.exposed_s);
  }
}

TEST(RecomputePlacement, HeuristicFillsWhatTheSharedPatternLeaves) {
  // Two identical blocks; nothing may be kept (window 0's base fills the memory). Layer 1's window fits one
  // of its two ops, layer 0's fits both: the pattern both share hides one op per block, and the fill puts
  // layer 0's second op into the room left in its window, which is the optimum.
  PlacementProblem problem;
  problem.windows = {{"pp recv mb 0", 0, 8 * kMiB}, {"tp bwd L1", 1 * kMs, 0}, {"tp bwd L0", 2 * kMs, 0}};
  for (int layer : {0, 1}) {
    const int own = 2 - layer;
    for (const char* name : {"a", "b"}) {
      RecomputableOp o = op("L" + std::to_string(layer) + "." + name, layer, 1.0, 1, own, own + 1);
      o.forward_window = 0;
      problem.ops.push_back(o);
    }
  }
  problem.memory_limit_bytes = 8 * kMiB;
  const PlacementResult heuristic = solve_heuristic(problem);
  EXPECT_EQ(heuristic.identical_block_classes, 1);
  expect_same(heuristic.exposed_s, 1.0 * kMs);
  expect_same(solve_optimal(problem).exposed_s, 1.0 * kMs);
}

// Two windows; nothing may be held at window 0's end (its base fills the limit), so keeping is impossible and
// recomputing in window 1 is the only way to hide an op.
PlacementProblem one_window_free(double capacity_ms, double slowdown) {
  PlacementProblem problem;
  problem.windows = {{"pp recv mb 0", 10 * kMs, 8 * kMiB}, {"tp allreduce bwd L1", capacity_ms * kMs, 0}};
  problem.ops = {op("A", 0, 1.0, 1, 0, 2), op("B", 0, 1.0, 1, 0, 2)};
  problem.slowdown = slowdown;
  problem.memory_limit_bytes = 8 * kMiB;
  return problem;
}

TEST(RecomputePlacement, CapacityBindsAndSlowdownScalesIt) {
  expect_same(solve_optimal(one_window_free(2.0, 1.0)).exposed_s, 0.0);
  expect_same(solve_optimal(one_window_free(1.0, 1.0)).exposed_s, 1.0 * kMs);  // only one fits
  expect_same(solve_optimal(one_window_free(2.0, 1.5)).exposed_s, 1.0 * kMs);  // 2 x 1.5 ms > 2 ms
  expect_same(solve_optimal(one_window_free(2.0, 2.0)).exposed_s, 1.0 * kMs);  // one at exactly 2 ms
  expect_same(solve_optimal(one_window_free(1.9, 2.0)).exposed_s, 2.0 * kMs);  // none
  const PlacementResult result = solve_optimal(one_window_free(1.0, 1.0));
  const int in_window = (result.placement[0].mode == RecomputeMode::window) + (result.placement[1].mode == RecomputeMode::window);
  EXPECT_EQ(in_window, 1);
  EXPECT_EQ(kept_bytes(one_window_free(1.0, 1.0), result.placement), 0.0);
}

TEST(RecomputePlacement, DependencyBinds) {
  // B reads A. Nothing may be held at window 0's end. B fits only window 1 and A windows 1 or 2, each fitting
  // one op: without the dependency B in 1 and A in 2 hide both; with it A must come no later than B.
  PlacementProblem problem;
  problem.windows = {{"w0", 5 * kMs, 8 * kMiB}, {"w1", 1 * kMs, 0}, {"w2", 1 * kMs, 0}};
  problem.ops = {op("A", 0, 1.0, 1, 0, 3), op("B", 0, 1.0, 1, 0, 2)};
  problem.memory_limit_bytes = 8 * kMiB;
  expect_same(solve_optimal(problem).exposed_s, 0.0);
  problem.ops[1].producers = {0};
  const PlacementResult result = solve_optimal(problem);
  expect_same(result.exposed_s, 1.0 * kMs);
  EXPECT_EQ(result.placement[1].mode, RecomputeMode::on_demand);
  EXPECT_FALSE(find_violation(problem, result.placement).has_value());
}

TEST(RecomputePlacement, MemoryLimitForcesOnDemandAndTheTieBreakPrefersWindows) {
  PlacementProblem problem;
  problem.windows = {{"dp bucket 0", 10 * kMs, 0}};
  problem.ops = {op("A", 0, 2.0, 1, 0, 1), op("B", 0, 1.0, 1, 0, 1)};
  problem.memory_limit_bytes = 100 * kMiB;
  expect_same(solve_optimal(problem).exposed_s, 0.0);
  problem.memory_limit_bytes = 1 * kMiB;  // room for one output
  const PlacementResult result = solve_optimal(problem);
  expect_same(result.exposed_s, 1.0 * kMs);  // B, the cheaper, on demand
  // A hidden either kept or in the window at equal exposure: the tie-break keeps fewest bytes.
  EXPECT_EQ(result.placement[0], (OpPlacement{RecomputeMode::window, 0}));
  EXPECT_EQ(result.placement[1].mode, RecomputeMode::on_demand);
  expect_same(result.peak_bytes, 1 * kMiB);
  problem.memory_limit_bytes = 0.5 * kMiB;  // room for none
  expect_same(solve_optimal(problem).exposed_s, 3.0 * kMs);
}

TEST(RecomputePlacement, AnInfeasibleMemoryLimitIsReported) {
  PlacementProblem problem = one_window_free(2.0, 1.0);
  problem.memory_limit_bytes = 7 * kMiB;  // below window 0's base alone
  for (auto solve : {solve_optimal, solve_heuristic}) {
    try {
      solve(problem, {});
      FAIL() << "an infeasible memory limit was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("even all on demand"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("pp recv mb 0"), std::string::npos) << e.what();
    }
  }
}

TEST(RecomputePlacement, MalformedProblemsAreRefused) {
  auto refused = [](PlacementProblem problem, const std::string& words) {
    try {
      check_problem(problem);
      ADD_FAILURE() << "accepted; expected: " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  const PlacementProblem good = one_window_free(2.0, 1.0);
  EXPECT_NO_THROW(check_problem(good));
  PlacementProblem p = good;
  p.slowdown = 0.9;
  refused(p, "slowdown");
  p = good;
  p.ops[1].name = "A";
  refused(p, "two ops are named 'A'");
  p = good;
  p.ops[0].deadline_window = 3;
  refused(p, "op 'A' has windows [0, 3)");
  p = good;
  p.ops[1].deadline_window = 1;
  p.ops[0].producers = {1};
  refused(p, "whose backward comes before");
  p = good;
  p.ops[0].forward_window = 1;
  refused(p, "before its forward");
  p = good;
  p.windows[1].label = "pp recv mb 0";
  refused(p, "two windows are labelled");
  EXPECT_THROW(solve_optimal(good, {0.0, 0.02}), std::invalid_argument);
  EXPECT_THROW(solve_heuristic(good, {1.0, -0.1}), std::invalid_argument);
}

TEST(RecomputePlacement, TheValidatorCatchesEachKindOfViolation) {
  PlacementProblem problem;
  problem.windows = {{"w0", 1 * kMs, 0}, {"w1", 1 * kMs, 0}, {"w2", 1 * kMs, 0}};
  problem.ops = {op("A", 0, 1.0, 1, 0, 3), op("B", 0, 1.0, 1, 1, 2, {0})};
  problem.memory_limit_bytes = 2 * kMiB;
  auto violation = [&](Placement placement) { return find_violation(problem, placement).value_or(""); };
  using M = RecomputeMode;
  EXPECT_EQ(violation({{M::window, 0}, {M::window, 1}}), "");
  EXPECT_NE(violation({{M::keep, -1}}).find("decides 1 ops but the problem has 2"), std::string::npos);
  EXPECT_NE(violation({{M::window, 3}, {M::on_demand, -1}}).find("window 3 but there are 3"), std::string::npos);
  EXPECT_NE(violation({{M::on_demand, -1}, {M::window, 0}}).find("before the first window it may use ('w1')"), std::string::npos);
  EXPECT_NE(violation({{M::on_demand, -1}, {M::window, 2}}).find("after its backward"), std::string::npos);
  EXPECT_NE(violation({{M::on_demand, -1}, {M::window, 1}}).find("producer 'A' is recomputed on demand"),
            std::string::npos);
  EXPECT_NE(violation({{M::window, 2}, {M::window, 1}}).find("later, in window 'w2'"), std::string::npos);
  EXPECT_NE(violation({{M::window, 1}, {M::window, 1}}).find("window 'w1' holds 2 ms"), std::string::npos);
  EXPECT_EQ(violation({{M::keep, -1}, {M::keep, -1}}), "");
  problem.memory_limit_bytes = 1 * kMiB;
  EXPECT_EQ(violation({{M::keep, -1}, {M::on_demand, -1}}), "");
  EXPECT_NE(violation({{M::keep, -1}, {M::keep, -1}}).find("at the end of window 'w1' 2097152 bytes are held"),
            std::string::npos);
  problem.slowdown = 1.5;
  EXPECT_NE(violation({{M::window, 0}, {M::on_demand, -1}}).find("holds 1.5 ms"), std::string::npos);
}

TEST(RecomputePolicy, RoundTripAndMalformedFiles) {
  PlacementProblem problem;
  problem.windows = {{"tp allreduce bwd L1", 1 * kMs, 0}, {"dp bucket 5", 1 * kMs, 0}};
  problem.ops = {op("L0.qkv", 0, 1.0, 1, 0, 2), op("L0.attn_core", 0, 1.0, 1, 0, 2, {0}),
                 op("L0.gelu", 0, 1.0, 1, 0, 2)};
  problem.memory_limit_bytes = 10 * kMiB;
  const Placement placement = {{RecomputeMode::window, 0}, {RecomputeMode::window, 1}, {RecomputeMode::keep, -1}};
  const nlohmann::json policy = placement_to_json(problem, placement);
  EXPECT_EQ(policy["placement"][1]["window"], "dp bucket 5");
  EXPECT_EQ(placement_from_json(problem, policy, "test"), placement);
  const Placement on_demand = {{RecomputeMode::on_demand, -1}, {RecomputeMode::keep, -1}, {RecomputeMode::on_demand, -1}};
  EXPECT_EQ(placement_from_json(problem, placement_to_json(problem, on_demand), "test"), on_demand);

  const std::string path = (std::filesystem::temp_directory_path() / "strata_test_recompute_policy.json").string();
  write_recompute_policy(path, problem, placement);
  EXPECT_EQ(read_recompute_policy(path, problem), placement);

  auto refused = [&](const std::function<void(nlohmann::json&)>& spoil, const std::string& words) {
    nlohmann::json bad = policy;
    spoil(bad);
    try {
      placement_from_json(problem, bad, "p.json");
      ADD_FAILURE() << "accepted; expected: " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("p.json"), std::string::npos) << e.what();
    }
  };
  refused([](nlohmann::json& j) { j = nlohmann::json::array(); }, "JSON object");
  refused([](nlohmann::json& j) { j["format"] = "other"; }, "\"format\"");
  refused([](nlohmann::json& j) { j["version"] = 2; }, "\"version\"");
  refused([](nlohmann::json& j) { j.erase("placement"); }, "\"placement\" must be an array");
  refused([](nlohmann::json& j) { j["placement"][0]["op"] = "L9.qkv"; }, "unknown op 'L9.qkv'");
  refused([](nlohmann::json& j) { j["placement"][2]["op"] = "L0.qkv"; }, "'L0.qkv' is decided twice");
  refused([](nlohmann::json& j) { j["placement"].erase(2); }, "'L0.gelu' has no entry");
  refused([](nlohmann::json& j) { j["placement"][2]["mode"] = "sometimes"; }, "has mode 'sometimes'");
  refused([](nlohmann::json& j) { j["placement"][2].erase("mode"); }, "needs \"mode\"");
  refused([](nlohmann::json& j) { j["placement"][0]["window"] = "pp recv mb 7"; }, "unknown window 'pp recv mb 7'");
  refused([](nlohmann::json& j) { j["placement"][0].erase("window"); }, "names no \"window\"");
  refused([](nlohmann::json& j) { j["placement"][2]["window"] = "dp bucket 5"; }, "mode keep but names a window");

  // Files: not JSON, and a well-formed policy that breaks a constraint (both windows' ops swapped).
  auto file_refused = [&](const std::string& text, const std::string& words) {
    std::ofstream(path) << text;
    try {
      read_recompute_policy(path, problem);
      ADD_FAILURE() << "accepted; expected: " << words;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  file_refused("{\"format\": ", "not JSON");
  nlohmann::json swapped = policy;
  swapped["placement"][0]["window"] = "dp bucket 5";
  swapped["placement"][1]["window"] = "tp allreduce bwd L1";
  file_refused(swapped.dump(), "does not fit this run: op 'L0.attn_core' is recomputed in window");
  std::filesystem::remove(path);
  EXPECT_THROW(read_recompute_policy(path, problem), UsageError);
}

// A 40-layer stage as the executor would measure it: six recomputable ops per block, two tensor-parallel
// windows in each layer's backward; an op may be recomputed in the windows of the two layers whose backward
// comes just before its own, and memory allows keeping under a third of what is recomputable.
PlacementProblem forty_layers(std::mt19937& rng) {
  const int layers = 40;
  std::normal_distribution<double> noise(1.0, 0.003);  // measured times of identical blocks differ slightly
  PlacementProblem problem;
  for (int n = 0; n < layers; ++n) {
    const int layer = layers - 1 - n;
    for (const char* part : {"mlp", "attn"})
      problem.windows.push_back({"tp allreduce bwd L" + std::to_string(layer) + " " + part, 1.2 * kMs * noise(rng), 0});
  }
  struct Kind {
    const char* name;
    double ms, mib;
    int producer;  // within the block, -1 none
  };
  const Kind kinds[] = {{"ln1", 0.1, 4, -1}, {"qkv", 0.9, 12, 0}, {"attn_core", 1.6, 4, 1},
                        {"ln2", 0.1, 4, -1}, {"mlp_up", 1.2, 16, 3}, {"gelu", 0.2, 16, 4}};
  double total_bytes = 0;
  for (int layer = 0; layer < layers; ++layer) {
    const int deadline = 2 * (layers - 1 - layer);
    const int offset = static_cast<int>(problem.ops.size());
    for (const Kind& kind : kinds) {
      RecomputableOp o = op("L" + std::to_string(layer) + "." + kind.name, layer, kind.ms * noise(rng), kind.mib,
                            std::max(deadline - 4, 0), deadline);
      o.forward_window = 0;  // the whole stage's forward comes before the first window of backward
      if (kind.producer >= 0) o.producers.push_back(offset + kind.producer);
      total_bytes += o.output_bytes;
      problem.ops.push_back(o);
    }
  }
  const double base = 512 * kMiB;
  for (int w = 0; w < 2 * layers; ++w) problem.windows[w].base_bytes = base * (1.0 - 0.5 * w / (2 * layers));
  problem.slowdown = 1.2;
  problem.memory_limit_bytes = base + 0.3 * total_bytes;
  return problem;
}

TEST(RecomputePlacement, SearchTimesOnFortyLayers) {
  std::mt19937 rng(test_seed() + 2);
  const PlacementProblem problem = forty_layers(rng);
  PlacementOptions options;
  // Short, to keep the unit tests quick: GLPK does not prove this optimum in it (STRATA_PLACEMENT_TIME_LIMIT
  // in seconds to search longer).
  const char* limit = std::getenv("STRATA_PLACEMENT_TIME_LIMIT");
  options.time_limit_s = limit ? std::strtod(limit, nullptr) : 5.0;
  const PlacementResult heuristic = solve_heuristic(problem, options);
  const PlacementResult optimal = solve_optimal(problem, options);
  EXPECT_FALSE(find_violation(problem, heuristic.placement).has_value());
  EXPECT_FALSE(find_violation(problem, optimal.placement).has_value());
  if (optimal.proven_optimal) {
    EXPECT_GE(heuristic.exposed_s, optimal.exposed_s - 1e-12);
  }
  std::printf("40 layers, %zu ops, %zu windows: optimal %.3f ms exposed (%s) in %.3f s; heuristic %.3f ms exposed "
              "(%d block classes) in %.3f s; gap %.2f%%\n",
              problem.ops.size(), problem.windows.size(), optimal.exposed_s / kMs,
              optimal.proven_optimal ? "proven" : "time limit", optimal.search_s, heuristic.exposed_s / kMs,
              heuristic.identical_block_classes, heuristic.search_s, 100 * heuristic_gap(heuristic, optimal));
}

}  // namespace
}  // namespace strata::train
