// strata-bench-horing: HO-Ring (the two-level collective pipelined over chunks) against the same two-level
// algorithm run one phase after another (hierarchical) and against a flat ring over every rank, measured side
// by side in one run, for allreduce, reduce-scatter and allgather at 64 KiB-64 MiB (nccl-tests' S), on two or
// more nodes: real ones, or emulated by grouping consecutive ranks (make bench: np 4 as 2 nodes of 2).
// Printed per size:
//   1. time per operation of horing, hierarchical and ring, and the ratios horing/hierarchical and horing/ring;
//   2. the phases of the two-level algorithm, each run alone on the process groups it uses (allreduce: intra
//      reduce-scatter, inter allreduce of the shard, intra allgather; reduce-scatter: intra reduce-scatter of
//      the node's super-blocks, inter reduce-scatter; allgather: inter allgather, intra allgather; each with
//      the local copies the algorithm makes), their sum, and HO-Ring time / sum of phases (< 1: the tiers
//      overlapped, as HO-Ring intends);
//   3. bytes each rank sent per tier (Work::traffic()) beside the formula, per algorithm and phase.
// Judged: every algorithm's result is exact (small integers add exactly in float; a wrong element ends the run,
// exit 1), and the bytes per tier, summed over ranks, equal the formula for every algorithm, phase and size
// (exit 3 otherwise): per rank, over g nodes of L ranks (n = gL), the two-level algorithms send 2(L-1)/L S
// inside the node and 2(g-1)/n S across nodes for an allreduce of S, (L-1)/L S and (g-1)/n S for a
// reduce-scatter or allgather, with ring phases inside the node (--intra messages); through shared memory
// (--intra shm, the default, as the process groups run them) a rank writes (L-1)/L of a reduce-scatter's input
// and its own block of an allgather, so the node's allgather phase counts 1/(L-1) of the ring's bytes. The flat
// ring sends 2(n-1)/n S or (n-1)/n S to its right neighbour, across nodes where that neighbour is on the next node. Reported, not judged: the speed ratios. With emulated nodes the "inter" tier is shared memory
// like the intra one, and 4 ranks share this machine's cores, so neither tier is the bottleneck HO-Ring hides,
// and the ratio says little about a cluster; tests/cluster/two-node.sh judges the overlap across two network
// namespaces joined by a rate-limited veth pair (--json gives it the figures).
// Rounds alternate between the contenders so machine noise hits all alike; figures are medians of samples that
// are each the max over ranks. Buffers are page-aligned, allocated and written once. --smoke (the test suite)
// runs 1/1024 of the sizes with 1 KiB HO-Ring chunks (so the pipeline runs) and judges nothing.
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/harness/harness.h"
#include "bench/harness/buffers.h"
#include "collectives/mpi_error.h"
#include "collectives/nccl_plan.h"  // ring_traffic
#include "collectives/operations.h"
#include "collectives/process_group.h"
#include "collectives/types.h"

namespace {

using namespace strata;
using coll::Algo;
using coll::Group;
using coll::Operation;
using coll::Traffic;
using coll::Work;

constexpr auto kFloat = coll::DataType::float32;
constexpr auto kSum = coll::RedOp::sum;

// Rank r's input: small integers, so every sum over ranks is exact in float.
float input_value(int rank, size_t i) { return static_cast<float>(static_cast<int>((i * 13 + rank * 7) % 9) - 4); }

// One timed contender: an algorithm, or one phase of the two-level algorithm run alone. `call` runs it once and
// returns the bytes this rank sent; `formula` is what it must send.
struct Contender {
  Contender(std::string name_, std::function<Traffic()> call_, Traffic formula_, bool phase_ = false)
      : name(std::move(name_)), call(std::move(call_)), formula(formula_), phase(phase_) {}
  std::string name;
  std::function<Traffic()> call;
  Traffic formula;
  bool phase = false;
  std::vector<double> samples;
  Traffic last;          // this rank's bytes in the last call
  long long calls = 0;   // every call made, timed or not
  Traffic sent;          // this rank's bytes over every call
};

// The run's flags.
struct Settings {
  int rounds = 5, iters = 4, ranks_per_node = -1, step_factor = 4;
  std::vector<Operation> operations;
  std::vector<std::string> contenders;
  std::string intra = "shm", json_path;
  size_t min_bytes = 0, max_bytes = 0;
  int64_t chunk_bytes = 0;
  bool smoke = false;
  bool wants(const std::string& name) const { return std::find(contenders.begin(), contenders.end(), name) != contenders.end(); }
};

// The operations the process groups run with HO-Ring, as the operations table says.
std::vector<Operation> horing_operations(const std::string& text) {
  std::string horing_ops;
  for (Operation operation : coll::kAllOperations)
    if (Group::supports(operation, Algo::horing))
      horing_ops += (horing_ops.empty() ? "" : ", ") + std::string(coll::name(operation));
  std::vector<Operation> operations;
  for (const std::string& name : split(text, ',')) {
    const std::optional<Operation> operation = coll::parse_operation(name);
    if (!operation || !Group::supports(*operation, Algo::horing))
      throw UsageError("--ops: '" + name + "' is not an operation HO-Ring runs (" + horing_ops + ")");
    operations.push_back(*operation);
  }
  return operations;
}

// nullopt after --help.
std::optional<Settings> parse_settings(int argc, char** argv) {
  Settings o;
  std::string ops_text = "allreduce,reduce_scatter,allgather", contenders_text = "horing,hierarchical,ring,phases";
  std::string min_text = "64K", max_text = "64M", chunk_text = "0";
  Cli cli("strata-bench-horing",
          "HO-Ring against the hierarchical two-level algorithm, its phases alone and a flat ring, on two or more "
          "nodes (real, or emulated: run with mpirun -np 4).");
  cli.option("ops", 0, "operations: allreduce,reduce_scatter,allgather (any of them)", ops_text);
  cli.option("contenders", 0, "what to time: horing,hierarchical,ring,phases (any of them)", contenders_text);
  cli.choice("intra", 0, "the two-level algorithms' phases inside a node: shm (shared memory, as the process groups "
             "run them where they can) or messages (rings)", o.intra, {"shm", "messages"});
  cli.option("minbytes", 'b', "smallest size S (K/M/G suffixes; nccl-tests' S per operation)", min_text);
  cli.option("maxbytes", 'e', "largest size S", max_text);
  cli.option("stepfactor", 'f', "multiply the size by this between steps", o.step_factor, 2);
  cli.option("ranks-per-node", 0,
             "emulated nodes of N consecutive ranks; 0: real nodes; -1: real nodes when the job spans two or more, "
             "else two emulated nodes",
             o.ranks_per_node, -1);
  cli.option("chunk-bytes", 0, "HO-Ring's chunk (K/M/G suffixes; 0: the library's default)", chunk_text);
  cli.option("rounds", 0, "alternating rounds per contender", o.rounds, 1);
  cli.option("iters", 'n', "timed samples per round", o.iters, 1);
  cli.option("json", 0, "rank 0 also writes the figures to this file as JSON (machine-readable)", o.json_path);
  cli.flag("smoke", 0, "tiny run for the test suite: sizes / 1024, 1 KiB chunks, 1 round of 2; nothing judged", o.smoke);
  if (!cli.parse(argc, argv)) return std::nullopt;
  if (o.smoke) o.rounds = 1, o.iters = 2;
  const size_t scale = o.smoke ? 1024 : 1;
  o.min_bytes = static_cast<size_t>(parse_bytes(min_text, "--minbytes")) / scale;
  o.max_bytes = static_cast<size_t>(parse_bytes(max_text, "--maxbytes")) / scale;
  o.chunk_bytes = parse_bytes(chunk_text, "--chunk-bytes");
  if (o.smoke && o.chunk_bytes == 0) o.chunk_bytes = 1024;
  if (o.min_bytes == 0 || o.min_bytes > o.max_bytes) throw UsageError("--minbytes must be positive and at most --maxbytes");
  {
    // Rank 0 writes the file, so rank 0 judges the path, and every rank stops together.
    std::string refusal;
    if (world_rank() == 0) try {
        check_outputs({}, {}, {{"--json", o.json_path, "the figures as JSON"}});
      } catch (const UsageError& e) {
        refusal = e.what();
      }
    refusal = broadcast_string(MPI_COMM_WORLD, refusal);
    if (!refusal.empty()) throw UsageError(refusal);
  }
  o.operations = horing_operations(ops_text);
  o.contenders = split(contenders_text, ',');
  for (const std::string& name : o.contenders)
    if (name != "horing" && name != "hierarchical" && name != "ring" && name != "phases")
      throw UsageError("--contenders: '" + name + "' is not horing, hierarchical, ring or phases");
  return o;
}

// The job as the two-level algorithm sees it: g nodes of L ranks; this rank is local index l on node m.
struct TwoLevel {
  Group& world;
  Group& intra;
  Group& inter;
  Algo intra_algo;  // the phases inside a node: shared memory, or rings of messages
  int L, g, l, m;
  // The world's ranks as a (local index, node) table, as the two-level algorithm lays blocks out: nodes in the order
  // of their ids, ranks of a node in rank order (rank_at[node * L + local]).
  std::vector<int> rank_at;
};

TwoLevel two_level(coll::ProcessGroups& groups, const Settings& o) {
  Group& world = groups.dp();
  Group& intra = groups.dp_intra();
  Group& inter = groups.dp_inter();
  if (world.node_count() < 2 || !world.even_nodes())
    throw UsageError("HO-Ring needs two or more nodes with the same number of ranks each (" +
                     std::to_string(world.node_count()) + " node(s) here; --ranks-per-node emulates them)");
  if (o.chunk_bytes > 0) world.horing_chunk_bytes = static_cast<size_t>(o.chunk_bytes);
  world.intra_shm = o.intra == "shm";
  // The phases alone run as the two-level algorithm runs them inside the node (its shared memory needs two or
  // more ranks per node; on one rank a phase inside the node sends nothing either way).
  const Algo intra_algo = world.intra_shm && intra.size() >= 2 ? Algo::shm : Algo::ring;
  TwoLevel t{world, intra, inter, intra_algo, intra.size(), inter.size(), intra.rank(), inter.rank(), {}};
  // The phases run alone use the inter group's rank as the node's position, so the two orders must agree (they do
  // when ranks fill nodes one after another).
  const int size = world.size(), rank = world_rank();
  std::map<int, std::vector<int>> members;
  for (int r = 0; r < size; ++r) members[world.node_of_rank()[static_cast<size_t>(r)]].push_back(r);
  for (const auto& [node, ranks] : members) t.rank_at.insert(t.rank_at.end(), ranks.begin(), ranks.end());
  if (t.rank_at[static_cast<size_t>(t.m * t.L + t.l)] != rank)
    throw RuntimeError("rank " + std::to_string(rank) + ": the inter group's order is not the order of the nodes");
  return t;
}

// The run's buffers, page-aligned, at the largest size, allocated once.
struct Buffers {
  PageAlignedFloats in, out, work;
};

// What a rank must send per tier, per phase of the two-level algorithm (inside the node a ring over L ranks, or
// shared memory; across nodes a ring over g), for an operation of S bytes in blocks of B bytes per rank.
std::vector<Traffic> phase_formulas(Operation operation, size_t S, size_t B, const TwoLevel& t) {
  const size_t Lz = static_cast<size_t>(t.L), gz = static_cast<size_t>(t.g);
  // Shared memory: an allgather inside the node counts a rank's own block, not the L - 1 it passes on.
  const uint64_t gather_share = t.intra_algo == Algo::shm ? 1 : Lz - 1;
  if (operation == Operation::allreduce)
    return {{(Lz - 1) * S / Lz, 0}, {0, 2 * (gz - 1) * S / (gz * Lz)}, {gather_share * S / Lz, 0}};
  if (operation == Operation::reduce_scatter) return {{(Lz - 1) * gz * B, 0}, {0, (gz - 1) * B}};
  return {{0, (gz - 1) * B}, {gather_share * gz * B, 0}};
}

Traffic done(Work w) {
  w.wait();
  return w.traffic();
}

// The two-level algorithm's phases, each a call on the process groups it uses with the local copies the algorithm
// makes, in its order: for an operation of S bytes, `block` elements per rank.
std::vector<std::pair<std::string, std::function<Traffic()>>> phase_calls(Operation operation, size_t S, size_t block,
                                                                          TwoLevel& t, Buffers& b) {
  const size_t Lz = static_cast<size_t>(t.L), gz = static_cast<size_t>(t.g);
  const size_t ml = static_cast<size_t>(t.m), ll = static_cast<size_t>(t.l);
  const size_t B = block * sizeof(float), shard = S / sizeof(float) / Lz;
  // Copies between the input's rank order and the (local index, node) order of the two-level algorithm.
  float* work = b.work.get();
  auto arranged = [work, block, gz](size_t local, size_t node) { return work + (local * gz + node) * block; };
  auto of_rank = [&t, block, Lz](float* base, size_t local, size_t node) {
    return base + static_cast<size_t>(t.rank_at[node * Lz + local]) * block;
  };
  Group& intra = t.intra;
  Group& inter = t.inter;
  const Algo intra_algo = t.intra_algo;
  float* in = b.in.get();
  float* out = b.out.get();
  if (operation == Operation::allreduce) {
    float* mine = out + ll * shard;
    return {{"intra reduce_scatter", [=, &intra] {
               std::memcpy(out, in, S);
               return done(intra.reduce_scatter(intra_algo, out, mine, shard, kFloat, kSum));
             }},
            {"inter allreduce", [=, &inter] { return done(inter.allreduce(Algo::ring, mine, mine, shard, kFloat, kSum)); }},
            {"intra allgather", [=, &intra] { return done(intra.allgather(intra_algo, mine, out, shard, kFloat)); }}};
  }
  if (operation == Operation::reduce_scatter) {
    float* super = arranged(ll, 0);
    return {{"intra reduce_scatter", [=, &intra] {
               for (size_t a = 0; a < Lz; ++a)
                 for (size_t k = 0; k < gz; ++k) std::memcpy(arranged(a, k), of_rank(in, a, k), B);
               return done(intra.reduce_scatter(intra_algo, work, super, gz * block, kFloat, kSum));
             }},
            {"inter reduce_scatter", [=, &inter] {
               Traffic sent = done(inter.reduce_scatter(Algo::ring, super, super + ml * block, block, kFloat, kSum));
               std::memcpy(out, super + ml * block, B);
               return sent;
             }}};
  }
  return {{"inter allgather", [=, &inter] {
             std::memcpy(arranged(ll, ml), in, B);
             return done(inter.allgather(Algo::ring, arranged(ll, ml), arranged(ll, 0), block, kFloat));
           }},
          {"intra allgather", [=, &intra] {
             Traffic sent = done(intra.allgather(intra_algo, arranged(ll, 0), work, gz * block, kFloat));
             for (size_t a = 0; a < Lz; ++a)
               for (size_t k = 0; k < gz; ++k) std::memcpy(of_rank(out, a, k), arranged(a, k), B);
             return sent;
           }}};
}

// The output against the exact result of the operation on every rank's input_value; a wrong element ends the run.
void check_result(Operation operation, size_t S, size_t block, const float* out, const std::string& what) {
  const int rank = world_rank(), size = world_size();
  const size_t count = S / sizeof(float);
  const size_t total = operation == Operation::reduce_scatter ? block : count;
  size_t wrong = 0;
  for (size_t i = 0; i < total; ++i) {
    float want = 0;
    if (operation == Operation::allgather) {
      want = input_value(static_cast<int>(i / block), i % block);
    } else {
      const size_t at = operation == Operation::reduce_scatter ? static_cast<size_t>(rank) * block + i : i;
      for (int r = 0; r < size; ++r) want += input_value(r, at);
    }
    wrong += out[i] != want;
  }
  if (wrong) throw RuntimeError(what + " " + std::string(coll::name(operation)) + " of " + human_bytes(S) + ": " +
                                std::to_string(wrong) + " wrong elements on rank " + std::to_string(rank));
}

// One size of one operation: its contenders, timed in alternating rounds, and each one's result checked.
struct Row {
  size_t bytes;
  std::vector<Contender> contenders;
  size_t chunks;
};

void call(Contender& c) {
  c.last = c.call();
  c.sent += c.last;
  ++c.calls;
}

Row measure_row(Operation operation, size_t S, const Settings& o, TwoLevel& t, Buffers& b, HostTimer& timer) {
  const int rank = world_rank(), size = world_size();
  const size_t count = S / sizeof(float), block = count / static_cast<size_t>(size);
  const size_t input_count = operation == Operation::allgather ? block : count;
  for (size_t i = 0; i < input_count; ++i) b.in[i] = input_value(rank, i);
  // The count argument of the operation (the whole buffer of an allreduce, one rank's block otherwise), which HO-Ring
  // cuts into chunks.
  const size_t op_count = coll::counts_for(operation, S, sizeof(float), size).count;
  const size_t per_chunk = std::max({size_t{1}, t.world.horing_chunk_bytes / sizeof(float),
                                     (op_count + Group::kHoRingChunks - 1) / Group::kHoRingChunks});
  Row row{S, {}, (op_count + per_chunk - 1) / per_chunk};

  // The formulas, per rank; the flat ring's is the operations table's ring model, 2(n-1)/n S or (n-1)/n S to the
  // right neighbour.
  const Traffic ring = coll::ring_traffic(operation, op_count, kFloat, rank, t.world.node_of_rank());
  const std::vector<Traffic> phase_formula = phase_formulas(operation, S, block * sizeof(float), t);
  Traffic two_level_formula;
  for (const Traffic& f : phase_formula) two_level_formula += f;
  const coll::OperationInfo& op_info = coll::info(operation);
  auto algorithm = [&, op_count](Algo algo) {
    return [&, op_count, algo] {
      Work w = op_info.start(t.world, algo, {b.in.get(), b.out.get(), op_count, kFloat, kSum}, coll::Waiting::later);
      w.wait();
      return w.traffic();
    };
  };
  if (o.wants("horing")) row.contenders.emplace_back("horing", algorithm(Algo::horing), two_level_formula);
  if (o.wants("hierarchical")) row.contenders.emplace_back("hierarchical", algorithm(Algo::hierarchical), two_level_formula);
  if (o.wants("ring")) row.contenders.emplace_back("ring", algorithm(Algo::ring), ring);
  if (o.wants("phases")) {
    const auto phases = phase_calls(operation, S, block, t, b);
    for (size_t p = 0; p < phases.size(); ++p)
      row.contenders.emplace_back(phases[p].first, phases[p].second, phase_formula[p], true);
  }

  // Samples, each the max over ranks of a loop of back-to-back calls (at least ~4 MiB moved).
  const int per_sample = static_cast<int>(std::clamp<size_t>((size_t{4} << 20) / S, 1, 64));
  for (int round = 0; round < o.rounds; ++round)
    for (Contender& c : row.contenders) {
      auto samples = measure(MPI_COMM_WORLD, MeasureSpec{round == 0 ? 2 : 0, o.iters, 0, per_sample}, timer, [&] {
        for (int k = 0; k < per_sample; ++k) call(c);
      });
      for (double& sample : samples) sample = allreduce_max(MPI_COMM_WORLD, sample);
      c.samples.insert(c.samples.end(), samples.begin(), samples.end());
    }

  // Each algorithm's result, and the phases' one after another, against the exact one.
  bool phases_checked = false;
  for (Contender& c : row.contenders) {
    std::memset(b.out.get(), 0, (operation == Operation::reduce_scatter ? block * sizeof(float) : S));
    if (!c.phase) {
      call(c);
      check_result(operation, S, block, b.out.get(), c.name);
    } else if (!phases_checked) {
      for (Contender& p : row.contenders)
        if (p.phase) call(p);
      check_result(operation, S, block, b.out.get(), "the phases of the two-level");
      phases_checked = true;
    }
  }
  return row;
}

// Bytes per tier summed over ranks, counted and by formula, in the contender's last call. Collective.
std::array<uint64_t, 4> summed_over_ranks(const Contender& c) {
  std::array<uint64_t, 4> sums = {c.last.intra_bytes, c.last.inter_bytes, c.formula.intra_bytes, c.formula.inter_bytes};
  STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums.data(), 4, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD));
  return sums;
}

// An operation's rows: printed on rank 0 (times, ratios, bytes against the formula), added to the JSON report and to
// each contender's bytes over the run. Returns whether every row's bytes equal the formula. Collective.
bool report_rows(Operation operation, std::vector<Row>& rows, nlohmann::json& report,
                 std::map<std::string, std::pair<Traffic, Traffic>>& sent_by) {
  const std::string op_name(coll::name(operation));
  const double size = world_size();
  bool bytes_match = true;
  for (Row& row : rows) {
    std::map<std::string, double> median;
    double phases_sum = 0;
    for (Contender& c : row.contenders) {
      median[c.name] = median_of(c.samples);
      if (c.phase) phases_sum += median[c.name];
    }
    auto at = [&](const char* name) { return median.count(name) ? median[name] : 0.0; };
    auto ratio = [](double a, double b) { return a > 0 && b > 0 ? a / b : 0.0; };
    const double horing = at("horing"), hier = at("hierarchical"), ring_time = at("ring");
    auto cell = [](double seconds) { return seconds > 0 ? format_fixed(seconds * 1e6, 1) : std::string("-"); };
    auto cell_ratio = [](double r) { return r > 0 ? format_fixed(r, 3) : std::string("-"); };
    print_on_root("%9s %6zu %11s %11s %11s %11s %9s %9s %9s %9s\n", human_bytes(row.bytes).c_str(), row.chunks,
        cell(horing).c_str(), cell(hier).c_str(), cell(ring_time).c_str(), cell(phases_sum).c_str(),
        cell_ratio(ratio(horing, hier)).c_str(), cell_ratio(ratio(horing, ring_time)).c_str(),
        cell_ratio(ratio(horing, phases_sum)).c_str(), cell_ratio(ratio(hier, phases_sum)).c_str());
    nlohmann::json json_row = {{"operation", op_name}, {"bytes", row.bytes}, {"chunks", row.chunks},
                               {"phases_sum_s", phases_sum}, {"phases", nlohmann::json::array()},
                               {"median_s", nlohmann::json::object()},
                               {"traffic", nlohmann::json::object()}};
    for (Contender& c : row.contenders) {
      const std::array<uint64_t, 4> sums = summed_over_ranks(c);
      const bool match = sums[0] == sums[2] && sums[1] == sums[3];
      bytes_match = bytes_match && match;
      json_row["median_s"][c.name] = median[c.name];
      if (c.phase) json_row["phases"].push_back(c.name);  // in the algorithm's order
      json_row["traffic"][c.name] = {{"intra_per_rank", sums[0] / size}, {"inter_per_rank", sums[1] / size},
                                     {"intra_formula_per_rank", sums[2] / size},
                                     {"inter_formula_per_rank", sums[3] / size}, {"match", match}};
      auto& [counted, formula] = sent_by[c.phase ? "phases" : c.name];
      counted += c.sent;
      formula += Traffic{c.formula.intra_bytes * static_cast<uint64_t>(c.calls),
                         c.formula.inter_bytes * static_cast<uint64_t>(c.calls)};
    }
    report["rows"].push_back(json_row);
  }
  // Bytes per tier of the largest size, per rank (mean over ranks), beside the formula.
  Row& last = rows.back();
  print_on_root("# bytes per rank at %s (mean over ranks), counted / formula:\n", human_bytes(last.bytes).c_str());
  for (Contender& c : last.contenders) {
    const std::array<uint64_t, 4> sums = summed_over_ranks(c);
    print_on_root("#   %-22s intra %12.0f / %12.0f   inter %12.0f / %12.0f\n", c.name.c_str(), sums[0] / size, sums[2] / size,
        sums[1] / size, sums[3] / size);
  }
  return bytes_match;
}

int run_targets(int argc, char** argv) {
  const std::optional<Settings> settings = parse_settings(argc, argv);
  if (!settings) return 0;
  Settings o = *settings;
  const int size = world_size();
  if (o.ranks_per_node == -1) {
    const std::vector<int> nodes = shared_memory_node_of_rank();
    const int node_count = *std::max_element(nodes.begin(), nodes.end()) + 1;
    if (node_count >= 2) o.ranks_per_node = 0;
    else if (size % 2 == 0) o.ranks_per_node = size / 2;
    else throw UsageError("one node and " + std::to_string(size) + " ranks: two emulated nodes need an even number");
  }
  coll::ProcessGroups groups(coll::GridShape{1, 1, size}, o.ranks_per_node);
  TwoLevel t = two_level(groups, o);

  // Sizes: a multiple of 4 n bytes, so every block split is even and each rank's bytes equal the formula.
  std::vector<size_t> sizes;
  const size_t unit = sizeof(float) * static_cast<size_t>(size);
  for (size_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= static_cast<size_t>(o.step_factor))
    if (bytes / unit * unit > 0 && (sizes.empty() || sizes.back() != bytes / unit * unit)) sizes.push_back(bytes / unit * unit);
  if (sizes.empty()) throw UsageError("no size of at least 4 x ranks bytes between --minbytes and --maxbytes");
  const size_t largest = sizes.back() / sizeof(float);
  Buffers buffers{page_aligned_floats(largest), page_aligned_floats(largest), page_aligned_floats(largest)};

  std::vector<std::string> hosts = gather_strings(MPI_COMM_WORLD, [] {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    STRATA_MPI_CHECK(MPI_Get_processor_name(name, &length));
    return std::string(name, static_cast<size_t>(length));
  }());
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  print_on_root("# strata-bench-horing: %d ranks as %d nodes x %d (%s), %d rounds x %d samples per contender, medians of the "
      "max over ranks\n", size, t.g, t.L, o.ranks_per_node > 0 ? "emulated nodes" : "real nodes", o.rounds, o.iters);
  print_on_root("# float sum; S = nccl-tests' size; HO-Ring chunk %s, at most %d chunks, %d in flight; inside a node: %s\n",
      human_bytes(t.world.horing_chunk_bytes).c_str(), Group::kHoRingChunks, Group::kHoRingWindow,
      t.intra_algo == Algo::shm ? "shared memory" : "rings of messages");

  nlohmann::json report = {{"program", "strata-bench-horing"}, {"ranks", size}, {"nodes", t.g}, {"ranks_per_node", t.L},
                           {"emulated", o.ranks_per_node > 0}, {"hosts", hosts}, {"intra", o.intra},
                           {"chunk_bytes", t.world.horing_chunk_bytes}, {"rounds", o.rounds}, {"iters", o.iters},
                           {"rows", nlohmann::json::array()}};
  std::map<std::string, std::pair<Traffic, Traffic>> sent_by;  // contender -> (counted, formula), this rank
  bool bytes_match = true;
  int missed = 0;
  auto verdict = [&](bool pass) {
    missed += pass ? 0 : 1;
    return o.smoke ? "smoke, not judged" : pass ? "PASS" : "MISS";
  };
  HostTimer timer;
  for (Operation operation : o.operations) {
    const std::string op_name(coll::name(operation));
    print_on_root("\n# %s: time per operation in us; ratios < 1: HO-Ring faster; phases = the two-level algorithm's phases, "
        "each run alone\n", op_name.c_str());
    print_on_root("%9s %6s %11s %11s %11s %11s %9s %9s %9s %9s\n", "size", "chunks", "horing", "hierarch", "ring", "phases",
        "/hier", "/ring", "/phases", "hier/ph");
    std::vector<Row> rows;
    for (size_t bytes : sizes) rows.push_back(measure_row(operation, bytes, o, t, buffers, timer));
    // Rank 0 prints; every rank takes part in the sums over ranks.
    const bool op_bytes_match = report_rows(operation, rows, report, sent_by);
    print_on_root("%s: bytes per tier equal the formula for every algorithm, phase and size: %s\n", op_name.c_str(),
        verdict(op_bytes_match));
    bytes_match = bytes_match && op_bytes_match;
  }

  // Over the whole run: what Strata's operations sent across nodes, summed over ranks (with warm-up and checks),
  // against the formula times the calls made; the cluster test holds the link's counters against it.
  nlohmann::json totals = nlohmann::json::object();
  for (auto& [name, pair] : sent_by) {
    uint64_t sums[4] = {pair.first.intra_bytes, pair.first.inter_bytes, pair.second.intra_bytes, pair.second.inter_bytes};
    STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums, 4, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD));
    totals[name] = {{"intra_bytes", sums[0]}, {"inter_bytes", sums[1]}, {"intra_formula", sums[2]},
                    {"inter_formula", sums[3]}};
  }
  report["sent"] = totals;
  report["results_exact"] = true;
  report["bytes_match_formula"] = bytes_match;
  if (world_rank() == 0 && !o.json_path.empty()) {
    std::ofstream file(o.json_path);
    file << report.dump(1) << "\n";
    if (!file) throw RuntimeError("cannot write " + o.json_path);
  }
  print_on_root("\n# results exact for every algorithm and the phases; the speed ratios are reported, not judged%s\n",
      o.ranks_per_node > 0 ? " (emulated nodes: both tiers are shared memory on one machine)" : "");
  STRATA_MPI_CHECK(MPI_Bcast(&missed, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (o.smoke) print_on_root("HO-Ring against hierarchical, its phases and a flat ring: smoke, not judged\n");
  if (missed && !o.smoke) print_on_root("%d figure(s) missed their target\n", missed);
  return missed && !o.smoke ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-bench-horing", [&] { return run_targets(argc, argv); });
}
