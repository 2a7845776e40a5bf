// Stage partitioning (train/partition.h): the balanced split is the best contiguous split, found by trying every
// one on small cases; memory refusals and ties behave as stated; the even split puts the remainder first.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <random>

#include "train/partition.h"

namespace strata::train {
namespace {

// Every split of `layers` into `stages` non-empty contiguous parts.
void every_split(int layers, int stages, std::vector<int>& prefix, const std::function<void(const std::vector<int>&)>& visit) {
  if (stages == 1) {
    prefix.push_back(layers);
    visit(prefix);
    prefix.pop_back();
    return;
  }
  for (int first = 1; first <= layers - (stages - 1); ++first) {
    prefix.push_back(first);
    every_split(layers - first, stages - 1, prefix, visit);
    prefix.pop_back();
  }
}

double slowest(const std::vector<int>& split, const StageCost& cost) {
  double worst = 0;
  for (std::size_t s = 0, first = 0; s < split.size(); first += static_cast<std::size_t>(split[s]), ++s)
    worst = std::max(worst, cost.seconds(static_cast<int>(s), static_cast<int>(first), static_cast<int>(first) + split[s]));
  return worst;
}

TEST(Partition, BalancedIsTheBestContiguousSplit) {
  std::mt19937_64 random(7);
  std::uniform_real_distribution<double> time(0.5, 2.0);
  for (int trial = 0; trial < 50; ++trial) {
    const int layers = 2 + static_cast<int>(random() % 9), stages = 1 + static_cast<int>(random() % std::min(layers, 4));
    LayerCosts costs;
    for (int l = 0; l < layers; ++l) {
      costs.forward.push_back(time(random)), costs.backward.push_back(2 * time(random));
      costs.recompute.push_back(trial % 2 ? time(random) : 0.0);
    }
    costs.embedding = time(random), costs.head = 3 * time(random);  // a heavy head, as a large vocabulary's
    const StageCost cost = costs.cost();
    const std::vector<int> split = balanced_partition(layers, stages, cost);
    double best = 1e300;
    std::vector<int> prefix;
    every_split(layers, stages, prefix, [&](const std::vector<int>& s) { best = std::min(best, slowest(s, cost)); });
    EXPECT_DOUBLE_EQ(slowest(split, cost), best) << "trial " << trial;
    EXPECT_EQ(static_cast<int>(split.size()), stages);
  }
}

TEST(Partition, MemoryRefusalsAndTiesAndTheEvenSplit) {
  LayerCosts uniform;
  uniform.forward.assign(6, 1.0), uniform.backward.assign(6, 2.0);
  StageCost cost = uniform.cost();
  EXPECT_EQ(balanced_partition(6, 3, cost), (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(balanced_partition(7, 2, LayerCosts{std::vector<double>(7, 1.0), std::vector<double>(7, 2.0), {}, 0, 0}.cost()),
            (std::vector<int>{4, 3}));  // a tie goes to more layers early
  // The first stage holds more micro-batches in flight: let it fit only one layer.
  cost.fits = [](int stage, int first, int end) { return stage != 0 || end - first <= 1; };
  EXPECT_EQ(balanced_partition(6, 3, cost).front(), 1);
  cost.fits = [](int, int, int) { return false; };
  EXPECT_THROW(balanced_partition(6, 3, cost), std::invalid_argument);
  EXPECT_THROW(balanced_partition(2, 3, uniform.cost()), std::invalid_argument);
  EXPECT_EQ(even_partition(10, 4), (std::vector<int>{3, 3, 2, 2}));
}

}  // namespace
}  // namespace strata::train
