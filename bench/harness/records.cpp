// Implementation of the step records (see records.h).
#include "bench/harness/records.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "bench/harness/check.h"
#include "bench/harness/harness.h"
#include "collectives/mpi.h"
#include "results/schema.h"

namespace strata {

ClockOffset measure_clock_offset(MPI_Comm world, int rounds) {
  // A private communicator: the ping-pong's messages cannot match a benchmark's own.
  MPI_Comm raw = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_dup(world, &raw));
  Comm comm(raw);
  const int rank = comm.rank(), size = comm.size();
  ClockOffset result;
  result.rounds = rounds;
  // Rank 0 serves one rank at a time, so no round trip waits behind another rank's.
  for (int peer = 1; peer < size; ++peer) {
    if (rank == 0) {
      for (int k = 0; k < rounds; ++k) {
        char ping = 0;
        STRATA_MPI_CHECK(MPI_Recv(&ping, 1, MPI_CHAR, peer, 0, comm.get(), MPI_STATUS_IGNORE));
        double now = host_now();
        STRATA_MPI_CHECK(MPI_Send(&now, 1, MPI_DOUBLE, peer, 1, comm.get()));
      }
    } else if (rank == peer) {
      double best = std::numeric_limits<double>::infinity();
      for (int k = 0; k < rounds; ++k) {
        char ping = 0;
        double remote = 0;
        double t0 = host_now();
        STRATA_MPI_CHECK(MPI_Send(&ping, 1, MPI_CHAR, 0, 0, comm.get()));
        STRATA_MPI_CHECK(MPI_Recv(&remote, 1, MPI_DOUBLE, 0, 1, comm.get(), MPI_STATUS_IGNORE));
        double t1 = host_now();
        if (t1 - t0 < best) {
          best = t1 - t0;
          result.offset = remote - (t0 + t1) / 2;
          result.round_trip = best;
          result.uncertainty = best / 2;
        }
      }
    }
  }
  return result;
}

namespace {
template <typename T>
std::vector<T> gatherv_numbers(MPI_Comm comm, const std::vector<T>& mine, MPI_Datatype type, std::vector<int>* counts_out) {
  int rank = 0, size = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  STRATA_MPI_CHECK(MPI_Comm_size(comm, &size));
  if (mine.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw RuntimeError("gatherv: more than 2^31 values on one rank");
  int count = static_cast<int>(mine.size());
  std::vector<int> counts(rank == 0 ? static_cast<size_t>(size) : 0), displs(counts.size());
  STRATA_MPI_CHECK(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm));
  std::vector<T> all;
  if (rank == 0) {
    int64_t total = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      displs[r] = static_cast<int>(total);
      total += counts[r];
    }
    if (total > std::numeric_limits<int>::max()) throw RuntimeError("gatherv: more than 2^31 values in all");
    all.resize(static_cast<size_t>(total));
  }
  STRATA_MPI_CHECK(MPI_Gatherv(mine.data(), count, type, all.data(), counts.data(), displs.data(), type, 0, comm));
  if (counts_out) *counts_out = counts;
  return all;
}
}  // namespace

std::vector<int64_t> gatherv(MPI_Comm comm, const std::vector<int64_t>& mine, std::vector<int>* counts) {
  return gatherv_numbers(comm, mine, MPI_INT64_T, counts);
}

std::vector<double> gatherv(MPI_Comm comm, const std::vector<double>& mine, std::vector<int>* counts) {
  return gatherv_numbers(comm, mine, MPI_DOUBLE, counts);
}

std::vector<std::string> gatherv(MPI_Comm comm, const std::vector<std::string>& mine, std::vector<int>* counts) {
  // Lengths, then every character at once.
  std::vector<int64_t> lengths;
  std::vector<char> chars;
  for (const auto& text : mine) {
    lengths.push_back(static_cast<int64_t>(text.size()));
    chars.insert(chars.end(), text.begin(), text.end());
  }
  std::vector<int64_t> all_lengths = gatherv(comm, lengths, counts);
  std::vector<char> all_chars = gatherv_numbers(comm, chars, MPI_CHAR, nullptr);
  std::vector<std::string> all;
  all.reserve(all_lengths.size());
  size_t at = 0;
  for (int64_t length : all_lengths) {
    all.emplace_back(all_chars.data() + at, static_cast<size_t>(length));
    at += static_cast<size_t>(length);
  }
  return all;
}

StepRecorder::StepRecorder(Run& run, int clock_rounds) : run_(run) {
  clock_ = measure_clock_offset(MPI_COMM_WORLD, clock_rounds);
  epoch_ = run_.is_root() ? host_now() : 0.0;
  STRATA_MPI_CHECK(MPI_Bcast(&epoch_, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD));

  std::vector<double> offsets = gatherv(MPI_COMM_WORLD, std::vector<double>{clock_.offset, clock_.uncertainty,
                                                                             clock_.round_trip});
  if (!run_.is_root()) return;
  Table table(schema::kClock);
  table.set_attr("sorted_by", "rank");
  table.add_column("rank", ColumnKind::int64, "1");
  table.add_column("offset", ColumnKind::float64, "s",
                   "rank 0's steady clock minus this rank's: t_rank0 - (t0 + t1) / 2 of the ping-pong round trip with "
                   "the smallest t1 - t0; 0 on rank 0");
  table.add_column("uncertainty", ColumnKind::float64, "s", "half the smallest round trip");
  table.add_column("round_trip", ColumnKind::float64, "s", "the smallest of `rounds` round trips to rank 0");
  table.add_column("rounds", ColumnKind::int64, "1", "round trips measured");
  for (size_t r = 0; r < offsets.size() / 3; ++r) {
    table.set("rank", r).set("offset", offsets[3 * r]).set("uncertainty", offsets[3 * r + 1]);
    table.set("round_trip", offsets[3 * r + 2]).set("rounds", r == 0 ? 0 : clock_rounds);
    table.end_row();
  }
  run_.append_table(table);
}

void StepRecorder::add_phase(const std::string& name, double seconds) {
  for (auto it = phases_.rbegin(); it != phases_.rend() && it->iteration == iteration_; ++it)
    if (it->name == name) {
      it->seconds += seconds;
      return;
    }
  phases_.push_back({iteration_, name, seconds});
}

void StepRecorder::add_event(std::string operation, std::string stream, double start, double end, int64_t bytes,
                             std::string group) {
  events_.push_back({iteration_, std::move(operation), std::move(stream), std::move(group), to_common(start),
                     to_common(end), bytes});
}

void StepRecorder::note_memory(const std::string& category, int64_t bytes) {
  for (auto& m : memory_)
    if (m.category == category) {
      m.bytes = std::max(m.bytes, bytes);
      return;
    }
  memory_.push_back({category, bytes});
}

void StepRecorder::add_metric(const std::string& name, double value, const std::string& unit) {
  metrics_.push_back({iteration_, name, unit, value});
}

namespace {
// Rank of every gathered row, from the per-rank counts.
std::vector<int64_t> ranks_of_rows(const std::vector<int>& counts) {
  std::vector<int64_t> ranks;
  for (size_t r = 0; r < counts.size(); ++r) ranks.insert(ranks.end(), static_cast<size_t>(counts[r]), static_cast<int64_t>(r));
  return ranks;
}

Table records_table(const char* name) {
  Table table(name);
  // Rows arrive case by case and, inside a case, rank by rank: readers may search instead of scanning.
  table.set_attr("sorted_by", "case,rank");
  table.add_column("case", ColumnKind::int64, "1");
  table.add_column("rank", ColumnKind::int64, "1");
  return table;
}

template <typename T, typename Get>
auto field(const std::vector<T>& rows, Get get) {
  std::vector<std::decay_t<decltype(get(rows.front()))>> values;
  values.reserve(rows.size());
  for (const auto& row : rows) values.push_back(get(row));
  return values;
}
}  // namespace

void StepRecorder::write_case(int case_index) {
  MPI_Comm world = MPI_COMM_WORLD;
  std::vector<int> counts;
  const bool root = run_.is_root();

  auto iterations = [](const auto& rows) { return field(rows, [](const auto& r) { return int64_t{r.iteration}; }); };

  Table phases = records_table(schema::kPhases);
  phases.add_column("iteration", ColumnKind::int64, "1", "timed iteration, as in the samples table");
  phases.add_column("phase", ColumnKind::string, "");
  phases.add_column("time", ColumnKind::float64, "s", "host time spent in the phase in this iteration on this rank, summed over its entries");
  {
    auto it = gatherv(world, iterations(phases_), &counts);
    auto names = gatherv(world, field(phases_, [](const Phase& p) { return p.name; }));
    auto times = gatherv(world, field(phases_, [](const Phase& p) { return p.seconds; }));
    auto ranks = ranks_of_rows(counts);
    for (size_t i = 0; root && i < it.size(); ++i) {
      phases.set("case", case_index).set("rank", ranks[i]).set("iteration", it[i]).set("phase", names[i]);
      phases.set("time", times[i]).end_row();
    }
  }

  Table events = records_table(schema::kEvents);
  events.add_column("iteration", ColumnKind::int64, "1", "timed iteration, as in the samples table");
  events.add_column("operation", ColumnKind::string, "");
  events.add_column("stream", ColumnKind::string, "", "where the event ran: host, or a device stream's name");
  events.add_column("start", ColumnKind::float64, "s",
                    "common clock: rank 0's steady clock since the clock measurement at the run's start; this rank's "
                    "times plus its offset in the clock table (GPU events anchored to host time)");
  events.add_column("end", ColumnKind::float64, "s", "common clock, as start");
  events.add_column("bytes", ColumnKind::int64, "B", "bytes the operation moved or touched; 0 when none");
  events.add_column("group", ColumnKind::string, "", "process group of a communication; empty for none");
  {
    auto it = gatherv(world, iterations(events_), &counts);
    auto operations = gatherv(world, field(events_, [](const Event& e) { return e.operation; }));
    auto streams = gatherv(world, field(events_, [](const Event& e) { return e.stream; }));
    auto groups = gatherv(world, field(events_, [](const Event& e) { return e.group; }));
    auto starts = gatherv(world, field(events_, [](const Event& e) { return e.start; }));
    auto ends = gatherv(world, field(events_, [](const Event& e) { return e.end; }));
    auto bytes = gatherv(world, field(events_, [](const Event& e) { return e.bytes; }));
    auto ranks = ranks_of_rows(counts);
    for (size_t i = 0; root && i < it.size(); ++i) {
      events.set("case", case_index).set("rank", ranks[i]).set("iteration", it[i]).set("operation", operations[i]);
      events.set("stream", streams[i]).set("start", starts[i]).set("end", ends[i]).set("bytes", bytes[i]);
      events.set("group", groups[i]).end_row();
    }
  }

  Table memory = records_table(schema::kMemory);
  memory.add_column("category", ColumnKind::string, "", "e.g. parameters, gradients, optimizer, activations, workspace");
  memory.add_column("bytes", ColumnKind::int64, "B", "high-water mark over the case on this rank");
  {
    auto categories = gatherv(world, field(memory_, [](const Memory& m) { return m.category; }), &counts);
    auto bytes = gatherv(world, field(memory_, [](const Memory& m) { return m.bytes; }));
    auto ranks = ranks_of_rows(counts);
    for (size_t i = 0; root && i < categories.size(); ++i)
      memory.set("case", case_index).set("rank", ranks[i]).set("category", categories[i]).set("bytes", bytes[i]).end_row();
  }

  Table metrics = records_table(schema::kMetrics);
  metrics.add_column("iteration", ColumnKind::int64, "1", "timed iteration, as in the samples table");
  metrics.add_column("metric", ColumnKind::string, "", "e.g. loss, grad_norm");
  metrics.add_column("value", ColumnKind::float64, "", "in the row's unit");
  metrics.add_column("unit", ColumnKind::string, "", "unit of value: SI as column units, 1 for dimensionless");
  {
    auto it = gatherv(world, iterations(metrics_), &counts);
    auto names = gatherv(world, field(metrics_, [](const Metric& m) { return m.name; }));
    auto units = gatherv(world, field(metrics_, [](const Metric& m) { return m.unit; }));
    auto values = gatherv(world, field(metrics_, [](const Metric& m) { return m.value; }));
    auto ranks = ranks_of_rows(counts);
    for (size_t i = 0; root && i < it.size(); ++i) {
      metrics.set("case", case_index).set("rank", ranks[i]).set("iteration", it[i]).set("metric", names[i]);
      metrics.set("value", values[i]).set("unit", units[i]).end_row();
    }
  }

  // Empty tables are still appended: their columns exist, so a reader finds the table of a run with no rows.
  if (root)
    for (const Table* table : {&phases, &events, &memory, &metrics}) run_.append_table(*table);
  phases_.clear(), events_.clear(), memory_.clear(), metrics_.clear();
  iteration_ = 0;
}

}  // namespace strata
