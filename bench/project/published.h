// strata-project validate --published FILE: measured steps of large-model training runs, as their papers and
// repositories published them (project/published/steps.json; docs/published-validation.md), each predicted on the
// system description its GPU names, beside the published step time, per part of the split (calibration rows may
// be used to set the descriptions, held-out rows never are) and per GPU generation.
#pragma once

#include <string>

namespace strata {

struct PublishedOptions {
  std::string file;     // the validation set (JSON, format "strata-published-steps")
  std::string systems;  // GPU=FILE,... overriding the set's own map from each row's GPU to a description
  std::string part = "all";  // calibration, held-out or all
  std::string only;     // ids (comma-separated) to predict instead of every row of the part
  std::string output;   // results file (empty: a new one)
  bool quiet = false;
  bool bench = false;   // judge the held-out errors against their targets; exit 3 when one is missed
  bool exact = false;   // the simulator's reference path (project::PredictOptions::exact)
};

// Collective over nothing (one process). Returns the exit code (3: a target missed with `bench`). UsageError for a
// file that is not a validation set, naming the row and field.
int validate_published(const PublishedOptions& options, int argc, char** argv, const std::string& config_json);

// The targets `bench` judges, per GPU generation over the held-out rows: mean and worst absolute step-time error.
inline constexpr double kPublishedMeanTarget = 0.05;
inline constexpr double kPublishedWorstTarget = 0.12;

}  // namespace strata
