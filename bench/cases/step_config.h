// The training step's flags as strata-step and strata-project predict take them (model, batch, strategies, grid,
// schedule, recomputation), their registration on a Cli, and the step's configuration built from them with every
// check strata-step makes, in its order and with its messages. strata-project validate rebuilds a measured case's
// configuration from the run's stored options through the same code.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/harness/cli.h"
#include "collectives/process_group.h"
#include "train/model_config.h"
#include "train/strategy.h"
#include "train/trainer.h"

namespace strata {

struct StepFlags {
  std::string model = "gpt2-124m";
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, vocab = 0, mlp_hidden = 0;  // 0: the preset's
  int seq = 128;
  int micro_batch = 1;
  int accumulation = 1;
  int64_t global_batch = 0;  // rows; 0: dp x accumulation x micro_batch
  // Whether --micro-batch and --accumulation were on the command line: with --global-batch, the one left out
  // follows (the accumulation, as Megatron-LM reads them, when both are left out the micro-batch); all three
  // given must agree.
  bool micro_batch_given = false, accumulation_given = false;
  int positions = 0;  // position table; 0: the preset's, for a custom shape at least --seq
  std::string paro, zero;
  int group_size = 0;
  std::string trainable = "all";
  std::string comm_algo = "library";
  std::string overlap = "on";
  std::string recompute = "none";
  int tp = 1, pp = 1;
  bool sp = false;
  std::string grid, grid_order = "tp,pp,dp";
  std::string schedule = "1f1b";
  int virtual_stages = 1;
  std::string stage_layers, partition = "uniform";
};

// --model ... --seq (the model and its sequence length).
void add_model_flags(Cli& cli, StepFlags& f);
// --micro-batch ... --overlap (the batch, the data-parallel strategies and their collectives).
void add_batch_flags(Cli& cli, StepFlags& f);
// --tp ... --stage-layers (the grid and the pipeline schedule).
void add_grid_flags(Cli& cli, StepFlags& f);

// --recompute none,full | all: the modes, in the order given; all has overlap where there are pipeline stages to
// wait for (without them it has no window and recomputes on demand, as full does, in more memory).
std::vector<train::Recompute> recompute_modes(const std::string& text, bool pipeline);
// --paro NNG,III | all and --zero 0,3 | all name strategies on one code path; refused ones say why.
std::vector<train::Strategy> strategies(const StepFlags& f);
// The preset with the flags' overrides, checked (and --seq against its position table).
train::ModelConfig model_of(const StepFlags& f);

// The step's configuration for `world` ranks, without the strategy, recomputation mode and the optimizer's
// settings (strata-step's own): every flag checked as strata-step checks it (UsageError naming the problem).
// Sets f.tp to the grid's.
struct StepPlan {
  train::ModelConfig model;
  std::vector<train::Strategy> strategies;
  std::vector<train::Recompute> modes;
  train::Trainable trainable;
  coll::GridShape grid;
  train::TrainConfig config;
  int64_t global_rows = 0;  // dp x accumulation x micro-batch
};
StepPlan plan_step(StepFlags& f, int world);

}  // namespace strata
