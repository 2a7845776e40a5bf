// A simulated timeline (project/simulate.h) as a Chrome trace (chrome://tracing, Perfetto), in the form
// scripts/strata-trace gives measured events: one process per rank, one thread per stream, times in
// microseconds from the step's start.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "project/simulate.h"

namespace strata {

// `stream_names`: a thread's name per stream (default: "compute", "stream N"); `phases`: one per interval (in the
// timeline's order), shown as the event's "phase" argument.
nlohmann::json timeline_to_chrome_trace(const project::Timeline& timeline, const std::map<int, std::string>& stream_names = {},
                                        const std::vector<std::string_view>& phases = {});

}  // namespace strata
