// What the result files say for a calibration (project/calibrate.h): the runs of strata-gemm, strata-attention,
// strata-elementwise, strata-collective and strata-interference read with the results reader, each case reduced to
// its median time, the device's peaks and memory bandwidth taken from the runs' machine description.
//
// Which runs count: status ok (a failed or interrupted run is skipped and named in the notes). GEMM: per shape
// and dtype the library the machine runs by default (the fastest where it is absent), median of the per-iteration
// mean over ranks (a device's own time while every device computes). Attention: the flash implementation, fwd
// and bwd. Collectives: the median of the per-iteration max over ranks; the group kind from the ranks of the
// case's first group in the `groups` table and the run's nodes (emulated nodes: consecutive ranks); sendrecv as
// the tier's point-to-point transfers; where one operation was timed in both modes, the mode with more cases.
// `--mixed` runs give the contention of concurrent groups when both the TP and DP groups hold two or more ranks.
#pragma once

#include <string>
#include <vector>

#include "project/calibrate.h"

namespace strata {

struct CalibrationFiles {
  project::CalibrationInput input;
  std::vector<std::string> notes;  // runs skipped or partly used, and why
  std::string summary;             // e.g. "strata-gemm 2, strata-collective 3 run(s)"
  std::string host;                // the first node of the first run used
};

// `device`: "auto" (the GPU when any GEMM run used one), "cpu" or "cuda". Throws BadResultsFile (exit 2) for a
// file that is not Strata results, UsageError for an unknown device.
CalibrationFiles read_calibration_input(const std::vector<std::string>& paths, const std::string& device);

}  // namespace strata
