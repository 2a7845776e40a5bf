// A simulated timeline (project/simulate.h) as a Chrome trace (chrome://tracing, Perfetto), in the form
// scripts/strata-trace gives measured events: one process per rank, one thread per stream, times in
// microseconds from the step's start.
#pragma once

#include <nlohmann/json.hpp>

#include "project/simulate.h"

namespace strata {

nlohmann::json timeline_to_chrome_trace(const project::Timeline& timeline);

}  // namespace strata
