#include "bench/project/calibration_input.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "bench/harness/check.h"
#include "bench/harness/machine.h"
#include "results/error.h"
#include "results/reader.h"

namespace strata {
namespace {

using project::GroupKind;

// One table of one run, its columns looked up by name; a missing column names the run and the table.
class View {
 public:
  View(Table table, std::string where) : table_(std::move(table)), where_(std::move(where)) {}

  size_t rows() const { return table_.rows(); }
  bool has(const std::string& name) const { return table_.has_column(name); }

  double number(const std::string& name, size_t row) const {
    const Column& c = column(name);
    if (c.kind == ColumnKind::int64) return static_cast<double>(c.ints.at(row));
    if (c.kind == ColumnKind::float64) return c.reals.at(row);
    throw BadResultsFile(where_ + ": column " + name + " is not numeric");
  }
  std::int64_t integer(const std::string& name, size_t row) const { return std::llround(number(name, row)); }
  std::string text(const std::string& name, size_t row) const {
    const Column& c = column(name);
    if (c.kind != ColumnKind::string) throw BadResultsFile(where_ + ": column " + name + " is not text");
    return c.texts.at(row);
  }

 private:
  const Column& column(const std::string& name) const {
    if (!table_.has_column(name)) throw BadResultsFile(where_ + " has no column " + name);
    return table_.column(name);
  }
  Table table_;
  std::string where_;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Half the relative range of figures that should agree (nodes, runs): 0 for one.
double half_range(const std::vector<double>& values) {
  const auto [low, high] = std::minmax_element(values.begin(), values.end());
  const double mid = median(values);
  return mid > 0 ? (*high - *low) / (2 * mid) : 0;
}

int to_int(const std::string& text, int fallback) {
  try {
    size_t used = 0;
    const int value = std::stoi(text, &used);
    return used == text.size() ? value : fallback;
  } catch (const std::exception&) {
    return fallback;
  }
}

// A run of a file, with what every reader of it needs.
struct RunRef {
  const ResultsReader* reader;
  std::string file, id, benchmark;
  std::map<std::string, std::string> attrs, env;
  std::string where() const { return file + " run " + id + " (" + benchmark + ")"; }
  View table(const std::string& name) const {
    return View(reader->table(id, name), where() + " table " + name);
  }
  bool has_table(const std::string& name) const {
    const auto names = reader->tables(id);
    return std::find(names.begin(), names.end(), name) != names.end();
  }
  int ranks_per_node() const {
    const int ranks = to_int(attrs.count("n_ranks") ? attrs.at("n_ranks") : "", 0);
    const int nodes = to_int(attrs.count("n_nodes") ? attrs.at("n_nodes") : "", 0);
    return nodes > 0 ? ranks / nodes : 0;
  }
  std::vector<MachineDescription> machines() const {
    std::vector<MachineDescription> out;
    const auto it = env.find("machine_json");
    if (it == env.end()) return out;
    try {
      for (const auto& node : nlohmann::json::parse(it->second)) out.push_back(machine_from_json(node));
    } catch (const std::exception& e) {
      throw BadResultsFile(where() + ": env machine_json cannot be read: " + e.what());
    }
    return out;
  }
};

// The summary row of each case.
std::map<std::int64_t, size_t> rows_by_case(const View& summary) {
  std::map<std::int64_t, size_t> rows;
  for (size_t r = 0; r < summary.rows(); ++r) rows[summary.integer("case", r)] = r;
  return rows;
}

double relative_spread(const View& summary, size_t row, const std::string& view) {
  const double mid = summary.number("time_" + view + "_median", row);
  return mid > 0 ? (summary.number("time_" + view + "_p95", row) - summary.number("time_" + view + "_p05", row)) / (2 * mid)
                 : 0;
}

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

class Collector {
 public:
  Collector(std::string device, CalibrationFiles& out) : device_(std::move(device)), out_(out) {}

  void gemm(const RunRef& run) {
    const View cases = run.table("cases"), summary = run.table("summary");
    const auto summary_row = rows_by_case(summary);
    const int threads = to_int(run.env.count("blas_threads_per_rank") ? run.env.at("blas_threads_per_rank") : "1", 1);
    const std::string default_library = run.env.count("gemm_default_backend") ? run.env.at("gemm_default_backend") : "";
    // (dtype, m, n, k) -> (library, seconds, spread) of every library measured at that shape.
    std::map<std::tuple<std::string, std::int64_t, std::int64_t, std::int64_t>,
             std::vector<std::tuple<std::string, double, double>>> shapes;
    size_t used = 0;
    for (size_t r = 0; r < cases.rows(); ++r) {
      const std::string backend = cases.text("backend", r);
      if ((device_ == "cuda") != (backend == "cuda")) continue;
      const auto row = summary_row.find(cases.integer("case", r));
      if (row == summary_row.end()) continue;
      const std::string dtype = cases.text("dtype", r);
      shapes[{dtype, cases.integer("m", r), cases.integer("n", r), cases.integer("k", r)}].emplace_back(
          cases.text("library", r), summary.number("time_rankmean_median", row->second),
          relative_spread(summary, row->second, "rankmean"));
      if (device_ == "cuda" && summary.has("peak_per_rank") && summary.number("peak_per_rank", row->second) > 0)
        gpu_peaks_[dtype] = {summary.number("peak_per_rank", row->second), 0,
                             summary.has("peak_source") ? summary.text("peak_source", row->second) : ""};
      ++used;
    }
    if (used == 0) {
      out_.notes.push_back(run.where() + ": no " + device_ + " cases");
      return;
    }
    if (device_ == "cpu") {
      if (threads_ == 0) threads_ = threads;
      if (threads != threads_) {
        out_.notes.push_back(run.where() + ": " + std::to_string(threads) + " BLAS thread(s) per rank, not " +
                             std::to_string(threads_) + " as the first GEMM run: skipped (one device per description)");
        return;
      }
      for (const MachineDescription& m : run.machines()) {
        peaks_["fp32"].push_back(m.fp32.per_rank(threads));
        peaks_["fp64"].push_back(m.fp64.per_rank(threads));
        peak_sources_["fp32"] = peak_source(m.fp32, threads);
        peak_sources_["fp64"] = peak_source(m.fp64, threads);
      }
    }
    for (const auto& [key, measured] : shapes) {
      const auto& [dtype, m, n, k] = key;
      const std::string preferred = dtype == "fp64" ? "openblas" : default_library;
      auto chosen = std::find_if(measured.begin(), measured.end(), [&](const auto& x) { return std::get<0>(x) == preferred; });
      if (chosen == measured.end())
        chosen = std::min_element(measured.begin(), measured.end(),
                                  [](const auto& a, const auto& b) { return std::get<1>(a) < std::get<1>(b); });
      out_.input.gemm.push_back({dtype, m, n, k, std::get<1>(*chosen), std::get<2>(*chosen)});
    }
    note_device(run);
    ++used_["strata-gemm"];
  }

  // Calls take(case row, summary row) for every case of `run` that `wanted` keeps and that has a summary row; on
  // the CPU only cases at the GEMM runs' thread count, noting how many others were left out. Returns how many it took.
  template <typename Wanted, typename Take>
  size_t take_cases(const RunRef& run, const View& cases, const View& summary, Wanted wanted, Take take) {
    const auto summary_row = rows_by_case(summary);
    size_t used = 0, other_threads = 0;
    for (size_t r = 0; r < cases.rows(); ++r) {
      if (!wanted(r)) continue;
      if (device_ == "cpu" && threads_ != 0 && cases.integer("threads", r) != threads_) {
        ++other_threads;
        continue;
      }
      const auto row = summary_row.find(cases.integer("case", r));
      if (row == summary_row.end()) continue;
      take(r, row->second);
      ++used;
    }
    if (other_threads)
      out_.notes.push_back(run.where() + ": " + std::to_string(other_threads) +
                           " case(s) with another thread count than the GEMM runs' left out");
    return used;
  }

  void attention(const RunRef& run) {
    const View cases = run.table("cases"), summary = run.table("summary");
    const size_t used = take_cases(run, cases, summary,
        [&](size_t r) {
          const std::string pass = cases.text("pass", r);
          return (device_ == "cuda") == (cases.text("backend", r) == "cuda") && cases.text("impl", r) == "flash" &&
                 (pass == "fwd" || pass == "bwd");
        },
        [&](size_t r, size_t row) {
          project::AttentionShape shape{cases.integer("batch", r),  cases.integer("heads_q", r),
                                        cases.integer("heads_kv", r), cases.integer("seq_q", r),
                                        cases.integer("seq_kv", r), cases.integer("head_dim", r),
                                        cases.integer("causal", r) != 0, cases.text("pass", r) == "bwd"};
          out_.input.attention.push_back({cases.text("dtype", r), shape, summary.number("time_rankmean_median", row),
                                          relative_spread(summary, row, "rankmean")});
        });
    if (used) ++used_["strata-attention"];
    else out_.notes.push_back(run.where() + ": no flash fwd or bwd case on the " + device_);
  }

  // The training step's elementwise kernels (CPU only: the GPU step's kernels are not these).
  void elementwise(const RunRef& run) {
    if (device_ != "cpu") {
      out_.notes.push_back(run.where() + ": CPU elementwise kernels, not this " + device_ + "'s: skipped");
      return;
    }
    const View cases = run.table("cases"), summary = run.table("summary");
    const bool eviction_recorded = cases.has("evict_bytes");
    const size_t used = take_cases(run, cases, summary, [](size_t) { return true; }, [&](size_t r, size_t row) {
      out_.input.elementwise.push_back({cases.text("kernel", r), cases.number("bytes", r),
                                        summary.number("time_rankmean_median", row),
                                        relative_spread(summary, row, "rankmean"),
                                        eviction_recorded && cases.number("evict_bytes", r) > 0});
    });
    if (used) ++used_["strata-elementwise"];
  }

  void collective(const RunRef& run) {
    const View cases = run.table("cases"), summary = run.table("summary");
    const auto summary_row = rows_by_case(summary);
    const std::string backend = device_ == "cuda" ? "nccl" : "mpi";
    const bool device_buffers = run.attrs.count("config_json") &&
                                run.attrs.at("config_json").find("\"device-buffers\":true") != std::string::npos;
    // Each rank's node: emulated nodes are runs of consecutive ranks; real ones come from the ranks table.
    std::vector<int> real_node;
    if (run.has_table("ranks")) {
      const View ranks = run.table("ranks");
      real_node.resize(ranks.rows());
      for (size_t r = 0; r < ranks.rows(); ++r) {
        const auto rank = static_cast<size_t>(ranks.integer("rank", r));
        if (rank < real_node.size()) real_node[rank] = static_cast<int>(ranks.integer("node_index", r));
      }
    }
    std::map<std::int64_t, std::string> first_group_members;
    if (run.has_table("groups")) {
      const View groups = run.table("groups");
      for (size_t r = 0; r < groups.rows(); ++r)
        if (groups.integer("group", r) == 0) first_group_members[groups.integer("case", r)] = groups.text("world_ranks", r);
    }
    size_t used = 0, contention = 0;
    for (size_t r = 0; r < cases.rows(); ++r) {
      const auto row = summary_row.find(cases.integer("case", r));
      if (row == summary_row.end()) continue;
      const std::string operation = cases.text("operation", r);
      const bool concurrent = cases.has("concurrent_with") && !cases.text("concurrent_with", r).empty();
      if (concurrent) {
        // --mixed: the contention of two groups only when both hold two or more ranks (the grid's tp and dp).
        const std::string grid = cases.has("grid") ? cases.text("grid", r) : "";
        int tp = 1, dp = 1;
        std::sscanf(grid.c_str(), "tp=%d,pp=%*d,dp=%d", &tp, &dp);
        if (tp >= 2 && dp >= 2 && summary.has("slowdown_vs_alone")) {
          out_.input.contention.push_back({operation, cases.number("size_bytes", r),
                                           summary.number("slowdown_vs_alone", row->second)});
          ++contention;
        }
        continue;
      }
      if (cases.text("backend", r) != backend || (backend == "mpi" && device_buffers)) continue;
      // A call timed after --flush-bytes of other traffic is another measurement than the mode's: not pooled with it.
      if (cases.has("flush_bytes") && cases.integer("flush_bytes", r) > 0) continue;
      const int ranks = static_cast<int>(cases.integer("group_size", r));
      if (ranks < 2) continue;
      // The group's kind from its members' nodes.
      const bool emulated = cases.integer("emulated_nodes", r) != 0;
      const int per_node = static_cast<int>(std::max<std::int64_t>(1, cases.integer("ranks_per_node", r)));
      std::vector<int> nodes;
      const auto members = first_group_members.find(cases.integer("case", r));
      if (members != first_group_members.end()) {
        for (const std::string& member : split_list(members->second)) {
          const int rank = to_int(member, -1);
          if (rank < 0) continue;
          nodes.push_back(emulated ? rank / per_node
                                   : (static_cast<size_t>(rank) < real_node.size() ? real_node[static_cast<size_t>(rank)] : 0));
        }
      }
      GroupKind kind;
      if (!nodes.empty()) {
        kind = project::group_kind_of(nodes);
      } else {
        const std::string g = cases.text("group_kind", r);
        const bool one_node = cases.integer("n_nodes", r) <= 1;
        kind = g == "intra" || one_node ? GroupKind::intra_node
               : g == "inter" || per_node == 1 ? GroupKind::inter_node
                                               : GroupKind::hierarchical;
      }
      const double seconds = summary.number("time_rankmax_median", row->second);
      const double bytes = cases.number("size_bytes", r);
      const std::string mode = cases.has("mode") ? cases.text("mode", r) : "";
      const std::string algorithm = backend == "nccl" ? "nccl" : cases.text("algo", r);
      if (operation == "sendrecv") {
        transfers_[{kind, mode}].push_back({kind, bytes, seconds, emulated});
      } else if (auto op = project::collective_from_name(operation)) {
        out_.input.collectives.push_back(
            {*op, algorithm, kind, ranks, bytes, seconds, emulated, mode == "blocking", run.file + " run " + run.id});
      } else {
        continue;
      }
      ++used;
    }
    if (used || contention) ++used_["strata-collective"];
    else out_.notes.push_back(run.where() + ": no " + backend + " case of a group of two or more ranks");
  }

  void interference(const RunRef& run) {
    const View cases = run.table("cases"), summary = run.table("summary");
    const auto summary_row = rows_by_case(summary);
    using Key = std::tuple<std::string, std::string, std::string, std::string, double>;
    std::map<Key, std::pair<double, double>> slowdowns;  // compute, communication
    for (size_t r = 0; r < cases.rows(); ++r) {
      if (cases.integer("overlapped", r) == 0) continue;
      const auto row = summary_row.find(cases.integer("case", r));
      if (row == summary_row.end()) continue;
      const Key key{cases.text("kernel", r), cases.text("kernel_shape", r), cases.text("operation", r),
                    cases.text("algo", r), cases.number("size_bytes", r)};
      auto [it, fresh] = slowdowns.try_emplace(key, std::nan(""), std::nan(""));
      const double slowdown = summary.number("slowdown_vs_alone", row->second);
      (cases.text("section", r) == "compute" ? it->second.first : it->second.second) = slowdown;
    }
    size_t used = 0;
    for (const auto& [key, pair] : slowdowns) {
      if (std::isnan(pair.first) || std::isnan(pair.second)) continue;
      out_.input.interference.push_back({std::get<0>(key), std::get<2>(key), std::get<4>(key), pair.first, pair.second});
      ++used;
    }
    if (used) ++used_["strata-interference"];
    else out_.notes.push_back(run.where() + ": no overlapped case with both slowdowns");
  }

  // A collective timed in both modes is fitted in each (a model per mode); a tier's point-to-point transfers in the
  // mode with more cases (blocking on a tie).
  void finish() {
    std::map<GroupKind, std::map<std::string, std::vector<project::TransferMeasurement>>> transfers_by_kind;
    for (auto& [key, list] : transfers_) transfers_by_kind[key.first][key.second] = list;
    for (auto& [kind, by_mode] : transfers_by_kind) {
      const auto chosen = std::max_element(by_mode.begin(), by_mode.end(), [](const auto& a, const auto& b) {
        return a.second.size() < b.second.size() || (a.second.size() == b.second.size() && b.first == "blocking");
      });
      for (const auto& t : chosen->second) out_.input.transfers.push_back(t);
    }
    for (const auto& [dtype, values] : peaks_)
      out_.input.peaks[dtype] = {median(values), half_range(values), peak_sources_[dtype]};
    for (const auto& [dtype, q] : gpu_peaks_) out_.input.peaks[dtype] = q;
    if (!memory_.empty()) {
      std::vector<double> bandwidth, efficiency;
      for (const auto& [b, e] : memory_) bandwidth.push_back(b), efficiency.push_back(e);
      out_.input.memory_bandwidth = project::Quantity{
          median(bandwidth), half_range(bandwidth),
          "measured: STREAM (the runs' machine description), per device: the larger of copy and triad, one core's or "
          "all cores' over the node's ranks, whichever is lower"};
      out_.input.memory_efficiency = project::Quantity{
          std::min(1.0, median(efficiency)), half_range(efficiency),
          "measured: STREAM triad (an elementwise kernel) over that bandwidth"};
    }
    std::vector<std::string> counts;
    for (const auto& [benchmark, count] : used_) counts.push_back(benchmark + " " + std::to_string(count));
    out_.summary = counts.empty() ? "no usable run" : join(counts, ", ") + " run(s)";
  }

  int threads() const { return threads_; }
  int ranks_per_node() const { return ranks_per_node_; }
  std::string device_name;

 private:
  static std::vector<std::string> split_list(const std::string& text) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= text.size()) {
      const size_t comma = text.find(',', start);
      out.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    return out;
  }

  // The device's name, node size and memory from the GEMM runs, which define the device.
  void note_device(const RunRef& run) {
    if (ranks_per_node_ == 0) ranks_per_node_ = run.ranks_per_node();
    if (device_ == "cpu") {
      for (const MachineDescription& m : run.machines()) {
        const int ranks = std::max(1, run.ranks_per_node());
        auto per_device = [&](const BandwidthFigure& f) {
          return f.all_cores > 0 ? std::min(f.one_core, f.all_cores / ranks) : f.one_core;
        };
        const double copy = per_device(m.memory.copy), triad = per_device(m.memory.triad);
        const double bandwidth = std::max(copy, triad);
        if (bandwidth > 0) memory_.emplace_back(bandwidth, triad / bandwidth);
        if (device_name.empty())
          device_name = m.cpu.model_name + ": one rank of " + std::to_string(ranks) + " per node, " +
                        std::to_string(threads_) + " thread(s)";
      }
    } else if (device_name.empty() && run.has_table("ranks")) {
      const View ranks = run.table("ranks");
      if (ranks.rows() > 0 && ranks.has("device")) device_name = ranks.text("device", 0);
    }
  }

  std::string device_;
  CalibrationFiles& out_;
  int threads_ = 0;
  int ranks_per_node_ = 0;
  std::map<std::string, std::vector<double>> peaks_;
  std::map<std::string, std::string> peak_sources_;
  std::map<std::string, project::Quantity> gpu_peaks_;
  std::vector<std::pair<double, double>> memory_;  // per device: bandwidth, triad's fraction of it
  std::map<std::pair<GroupKind, std::string>, std::vector<project::TransferMeasurement>> transfers_;
  std::map<std::string, int> used_;
};

}  // namespace

CalibrationFiles read_calibration_input(const std::vector<std::string>& paths, const std::string& device) {
  if (device != "auto" && device != "cpu" && device != "cuda")
    throw UsageError("unknown device '" + device + "' (auto, cpu, cuda)");
  if (paths.empty()) throw UsageError("no result files given");
  std::vector<std::unique_ptr<ResultsReader>> readers;
  std::vector<RunRef> runs;
  for (const std::string& path : paths) {
    readers.push_back(std::make_unique<ResultsReader>(path));
    const ResultsReader& reader = *readers.back();
    for (const std::string& id : reader.runs()) {
      RunRef run{&reader, path, id, "", reader.run_attrs(id), reader.env(id)};
      run.benchmark = run.attrs.count("benchmark") ? run.attrs.at("benchmark") : "";
      runs.push_back(std::move(run));
    }
  }
  // The device: the GPU when any GEMM run used one, unless told.
  std::string chosen = device;
  if (chosen == "auto") {
    chosen = "cpu";
    for (const RunRef& run : runs)
      if (run.benchmark == "strata-gemm" && run.attrs.count("config_json") &&
          run.attrs.at("config_json").find("\"backend\":\"cuda\"") != std::string::npos)
        chosen = "cuda";
  }
  CalibrationFiles out;
  Collector collect(chosen, out);
  std::set<std::string> files;
  int ignored = 0;
  // GEMM first: its runs define the device (threads per rank) that attention is read against.
  for (const char* benchmark : {"strata-gemm", "strata-attention", "strata-elementwise", "strata-collective",
                                "strata-interference"})
    for (const RunRef& run : runs) {
      if (run.benchmark != benchmark) continue;
      const std::string status = run.attrs.count("status") ? run.attrs.at("status") : "";
      if (status != "ok") {
        out.notes.push_back(run.where() + ": status " + (status.empty() ? "missing" : status) + ": skipped");
        continue;
      }
      if (run.benchmark == "strata-gemm") collect.gemm(run);
      if (run.benchmark == "strata-attention") collect.attention(run);
      if (run.benchmark == "strata-elementwise") collect.elementwise(run);
      if (run.benchmark == "strata-collective") collect.collective(run);
      if (run.benchmark == "strata-interference") collect.interference(run);
      files.insert(run.file);
      if (out.host.empty() && run.attrs.count("hosts")) {
        try {
          const auto hosts = nlohmann::json::parse(run.attrs.at("hosts"));
          if (hosts.is_array() && !hosts.empty() && hosts[0].is_string()) out.host = hosts[0].get<std::string>();
        } catch (const nlohmann::json::exception&) {
          // A malformed host list names nothing; the description is named without it.
        }
      }
    }
  for (const RunRef& run : runs)
    if (run.benchmark != "strata-gemm" && run.benchmark != "strata-attention" && run.benchmark != "strata-elementwise" &&
        run.benchmark != "strata-collective" && run.benchmark != "strata-interference")
      ++ignored;
  collect.finish();
  if (ignored) out.notes.push_back(std::to_string(ignored) + " run(s) of other programs ignored");
  project::CalibrationInput& in = out.input;
  in.device_name = collect.device_name.empty() ? (chosen == "cuda" ? "GPU" : "CPU") : collect.device_name;
  in.device_source = chosen == "cpu"
                         ? "measured: one MPI rank with its BLAS threads is one device; peaks and memory from the runs' "
                           "machine description (measured FMA chains, STREAM)"
                         : "measured: one GPU per rank; peaks from strata-gemm's table of the architecture";
  in.devices_per_node = collect.ranks_per_node();
  // The programs whose runs were read, by name: a reader can tell what a description was fitted from (strata-project
  // validate refuses one fitted from strata-step runs).
  in.provenance = out.summary + " of " + join(std::vector<std::string>(files.begin(), files.end()), ", ");
  return out;
}

}  // namespace strata
