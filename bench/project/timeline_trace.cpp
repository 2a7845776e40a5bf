#include "bench/project/timeline_trace.h"

#include <set>
#include <string>
#include <utility>

namespace strata {

nlohmann::json timeline_to_chrome_trace(const project::Timeline& timeline, const std::map<int, std::string>& stream_names,
                                        const std::vector<std::string_view>& phases) {
  nlohmann::json events = nlohmann::json::array();
  std::set<int> ranks;
  std::set<std::pair<int, int>> streams;
  for (std::size_t k = 0; k < timeline.intervals.size(); ++k) {
    const project::Interval& interval = timeline.intervals[k];
    if (ranks.insert(interval.rank).second) {
      events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", interval.rank}, {"tid", 0},
                        {"args", {{"name", "rank " + std::to_string(interval.rank)}}}});
      events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", interval.rank}, {"tid", 0},
                        {"args", {{"sort_index", interval.rank}}}});
    }
    if (streams.insert({interval.rank, interval.stream}).second) {
      const auto named = stream_names.find(interval.stream);
      const std::string name = named != stream_names.end()                 ? named->second
                               : interval.stream == project::kComputeStream ? "compute"
                                                                            : "stream " + std::to_string(interval.stream);
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", interval.rank}, {"tid", interval.stream},
                        {"args", {{"name", name}}}});
    }
    nlohmann::json event = {{"ph", "X"}, {"name", interval.name}, {"cat", project::op_kind_name(interval.kind)},
                            {"pid", interval.rank}, {"tid", interval.stream}, {"ts", interval.start * 1e6},
                            {"dur", (interval.end - interval.start) * 1e6}};
    if (k < phases.size() && !phases[k].empty()) event["args"] = {{"phase", std::string(phases[k])}};
    events.push_back(std::move(event));
  }
  return {{"traceEvents", events},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"clock", "simulated seconds since the step's start"}, {"step_s", timeline.step_s}}}};
}

}  // namespace strata
