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

int run_targets(int argc, char** argv) {
  int rounds = 5, iters = 4, ranks_per_node = -1;
  std::string ops_text = "allreduce,reduce_scatter,allgather", contenders_text = "horing,hierarchical,ring,phases";
  std::string min_text = "64K", max_text = "64M", chunk_text = "0", json_path;
  int step_factor = 4;
  bool smoke = false;
  Cli cli("strata-bench-horing",
          "HO-Ring against the hierarchical two-level algorithm, its phases alone and a flat ring, on two or more "
          "nodes (real, or emulated: run with mpirun -np 4).");
  cli.option("ops", 0, "operations: allreduce,reduce_scatter,allgather (any of them)", ops_text);
  cli.option("contenders", 0, "what to time: horing,hierarchical,ring,phases (any of them)", contenders_text);
  std::string intra_text = "shm";
  cli.choice("intra", 0, "the two-level algorithms' phases inside a node: shm (shared memory, as the process groups "
             "run them where they can) or messages (rings)", intra_text, {"shm", "messages"});
  cli.option("minbytes", 'b', "smallest size S (K/M/G suffixes; nccl-tests' S per operation)", min_text);
  cli.option("maxbytes", 'e', "largest size S", max_text);
  cli.option("stepfactor", 'f', "multiply the size by this between steps", step_factor, 2);
  cli.option("ranks-per-node", 0,
             "emulated nodes of N consecutive ranks; 0: real nodes; -1: real nodes when the job spans two or more, "
             "else two emulated nodes",
             ranks_per_node, -1);
  cli.option("chunk-bytes", 0, "HO-Ring's chunk (K/M/G suffixes; 0: the library's default)", chunk_text);
  cli.option("rounds", 0, "alternating rounds per contender", rounds, 1);
  cli.option("iters", 'n', "timed samples per round", iters, 1);
  cli.option("json", 0, "rank 0 also writes the figures to this file as JSON (machine-readable)", json_path);
  cli.flag("smoke", 0, "tiny run for the test suite: sizes / 1024, 1 KiB chunks, 1 round of 2; nothing judged", smoke);
  if (!cli.parse(argc, argv)) return 0;
  if (smoke) rounds = 1, iters = 2;
  const size_t scale = smoke ? 1024 : 1;
  const size_t min_bytes = static_cast<size_t>(parse_bytes(min_text, "--minbytes")) / scale;
  const size_t max_bytes = static_cast<size_t>(parse_bytes(max_text, "--maxbytes")) / scale;
  int64_t chunk_bytes = parse_bytes(chunk_text, "--chunk-bytes");
  if (smoke && chunk_bytes == 0) chunk_bytes = 1024;
  if (min_bytes == 0 || min_bytes > max_bytes) throw UsageError("--minbytes must be positive and at most --maxbytes");
  {
    // Rank 0 writes the file, so rank 0 judges the path, and every rank stops together.
    std::string refusal;
    if (world_rank() == 0) try {
        check_outputs({}, {}, {{"--json", json_path, "the figures as JSON"}});
      } catch (const UsageError& e) {
        refusal = e.what();
      }
    refusal = broadcast_string(MPI_COMM_WORLD, refusal);
    if (!refusal.empty()) throw UsageError(refusal);
  }

  // The operations the process groups run with HO-Ring, as the operations table says.
  std::string horing_ops;
  for (Operation operation : coll::kAllOperations)
    if (Group::supports(operation, Algo::horing))
      horing_ops += (horing_ops.empty() ? "" : ", ") + std::string(coll::name(operation));
  std::vector<Operation> operations;
  for (const std::string& name : split(ops_text, ',')) {
    const std::optional<Operation> operation = coll::parse_operation(name);
    if (!operation || !Group::supports(*operation, Algo::horing))
      throw UsageError("--ops: '" + name + "' is not an operation HO-Ring runs (" + horing_ops + ")");
    operations.push_back(*operation);
  }
  std::vector<std::string> wanted = split(contenders_text, ',');
  for (const std::string& name : wanted)
    if (name != "horing" && name != "hierarchical" && name != "ring" && name != "phases")
      throw UsageError("--contenders: '" + name + "' is not horing, hierarchical, ring or phases");
  auto wants = [&](const std::string& name) { return std::find(wanted.begin(), wanted.end(), name) != wanted.end(); };

  const int rank = world_rank(), size = world_size();
  if (ranks_per_node == -1) {
    const std::vector<int> nodes = shared_memory_node_of_rank();
    const int node_count = *std::max_element(nodes.begin(), nodes.end()) + 1;
    if (node_count >= 2) ranks_per_node = 0;
    else if (size % 2 == 0) ranks_per_node = size / 2;
    else throw UsageError("one node and " + std::to_string(size) + " ranks: two emulated nodes need an even number");
  }
  coll::ProcessGroups groups(coll::GridShape{1, 1, size}, ranks_per_node);
  Group& world = groups.dp();
  Group& intra = groups.dp_intra();
  Group& inter = groups.dp_inter();
  if (world.node_count() < 2 || !world.even_nodes())
    throw UsageError("HO-Ring needs two or more nodes with the same number of ranks each (" +
                     std::to_string(world.node_count()) + " node(s) here; --ranks-per-node emulates them)");
  if (chunk_bytes > 0) world.horing_chunk_bytes = static_cast<size_t>(chunk_bytes);
  world.intra_shm = intra_text == "shm";
  // The phases alone run as the two-level algorithm runs them inside the node (its shared memory needs two or
  // more ranks per node; on one rank a phase inside the node sends nothing either way).
  const Algo intra_algo = world.intra_shm && intra.size() >= 2 ? Algo::shm : Algo::ring;
  const int L = intra.size(), g = inter.size(), l = intra.rank(), m = inter.rank();

  // The world's ranks as a (local index, node) table, as the two-level algorithm lays blocks out: nodes in the
  // order of their ids, ranks of a node in rank order. The phases run alone use the inter group's rank as the
  // node's position, so the two orders must agree (they do when ranks fill nodes one after another).
  std::map<int, std::vector<int>> members;
  for (int r = 0; r < size; ++r) members[world.node_of_rank()[static_cast<size_t>(r)]].push_back(r);
  std::vector<int> rank_at;  // rank_at[node * L + local]
  for (const auto& [node, ranks] : members) rank_at.insert(rank_at.end(), ranks.begin(), ranks.end());
  if (rank_at[static_cast<size_t>(m * L + l)] != rank)
    throw RuntimeError("rank " + std::to_string(rank) + ": the inter group's order is not the order of the nodes");

  auto say = [&](const char* format, auto... args) {
    if (rank == 0) std::printf(format, args...);
  };
  int missed = 0;
  auto verdict = [&](bool pass) {
    missed += pass ? 0 : 1;
    return smoke ? "smoke, not judged" : pass ? "PASS" : "MISS";
  };
  HostTimer timer;

  // Sizes: a multiple of 4 n bytes, so every block split is even and each rank's bytes equal the formula.
  std::vector<size_t> sizes;
  const size_t unit = sizeof(float) * static_cast<size_t>(size);
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= static_cast<size_t>(step_factor))
    if (bytes / unit * unit > 0 && (sizes.empty() || sizes.back() != bytes / unit * unit)) sizes.push_back(bytes / unit * unit);
  if (sizes.empty()) throw UsageError("no size of at least 4 x ranks bytes between --minbytes and --maxbytes");
  const size_t largest = sizes.back() / sizeof(float);
  auto in = page_aligned_floats(largest), out = page_aligned_floats(largest), work = page_aligned_floats(largest);

  std::vector<std::string> hosts = gather_strings(MPI_COMM_WORLD, [] {
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    STRATA_MPI_CHECK(MPI_Get_processor_name(name, &length));
    return std::string(name, static_cast<size_t>(length));
  }());
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  say("# strata-bench-horing: %d ranks as %d nodes x %d (%s), %d rounds x %d samples per contender, medians of the "
      "max over ranks\n", size, g, L, ranks_per_node > 0 ? "emulated nodes" : "real nodes", rounds, iters);
  say("# float sum; S = nccl-tests' size; HO-Ring chunk %s, at most %d chunks, %d in flight; inside a node: %s\n",
      human_bytes(world.horing_chunk_bytes).c_str(), Group::kHoRingChunks, Group::kHoRingWindow,
      intra_algo == Algo::shm ? "shared memory" : "rings of messages");

  nlohmann::json report = {{"program", "strata-bench-horing"}, {"ranks", size}, {"nodes", g}, {"ranks_per_node", L},
                           {"emulated", ranks_per_node > 0}, {"hosts", hosts}, {"intra", intra_text},
                           {"chunk_bytes", world.horing_chunk_bytes}, {"rounds", rounds}, {"iters", iters},
                           {"rows", nlohmann::json::array()}};
  std::map<std::string, std::pair<Traffic, Traffic>> sent_by;  // contender -> (counted, formula), this rank
  bool bytes_match = true;

  for (Operation operation : operations) {
    const std::string op_name(coll::name(operation));
    say("\n# %s: time per operation in us; ratios < 1: HO-Ring faster; phases = the two-level algorithm's phases, "
        "each run alone\n", op_name.c_str());
    say("%9s %6s %11s %11s %11s %11s %9s %9s %9s %9s\n", "size", "chunks", "horing", "hierarch", "ring", "phases",
        "/hier", "/ring", "/phases", "hier/ph");
    struct Row {
      size_t bytes;
      std::vector<Contender> contenders;
      size_t chunks;
    };
    std::vector<Row> rows;
    for (size_t bytes : sizes) {
      const size_t S = bytes, count = S / sizeof(float), n = static_cast<size_t>(size);
      const size_t Lz = static_cast<size_t>(L), gz = static_cast<size_t>(g);
      // Elements per rank block (reduce-scatter's output, allgather's input) and the allreduce shard.
      const size_t block = count / n, shard = count / Lz, B = block * sizeof(float);
      const size_t input_count = operation == Operation::allgather ? block : count;
      for (size_t i = 0; i < input_count; ++i) in[i] = input_value(rank, i);
      // The count argument of the operation (the whole buffer of an allreduce, one rank's block otherwise), which
      // HO-Ring cuts into chunks.
      const size_t op_count = coll::counts_for(operation, S, sizeof(float), size).count;
      const size_t per_chunk = std::max({size_t{1}, world.horing_chunk_bytes / sizeof(float),
                                         (op_count + Group::kHoRingChunks - 1) / Group::kHoRingChunks});
      const size_t chunks = (op_count + per_chunk - 1) / per_chunk;

      // The formulas, per rank. Two-level: inside the node a ring over L ranks, across nodes a ring over g.
      // The flat ring: the operations table's ring model, 2(n-1)/n S or (n-1)/n S to the right neighbour.
      const Traffic ring = coll::ring_traffic(operation, op_count, kFloat, rank, world.node_of_rank());
      Traffic two_level;
      std::vector<Traffic> phase_formula;
      // Shared memory: an allgather inside the node counts a rank's own block, not the L - 1 it passes on.
      const uint64_t gather_share = intra_algo == Algo::shm ? 1 : Lz - 1;
      if (operation == Operation::allreduce)
        phase_formula = {{(Lz - 1) * S / Lz, 0}, {0, 2 * (gz - 1) * S / (gz * Lz)}, {gather_share * S / Lz, 0}};
      else if (operation == Operation::reduce_scatter)
        phase_formula = {{(Lz - 1) * gz * B, 0}, {0, (gz - 1) * B}};
      else
        phase_formula = {{0, (gz - 1) * B}, {gather_share * gz * B, 0}};
      for (const Traffic& t : phase_formula) two_level += t;

      const coll::OperationInfo& op_info = coll::info(operation);
      auto algorithm = [&, op_count](Algo algo) {
        return [&, op_count, algo] {
          Work w = op_info.start(world, algo, {in.get(), out.get(), op_count, kFloat, kSum}, coll::Waiting::later);
          w.wait();
          return w.traffic();
        };
      };
      auto done = [](Work w) {
        w.wait();
        return w.traffic();
      };
      // Copies between the input's rank order and the (local index, node) order of the two-level algorithm.
      auto arranged = [&](size_t local, size_t node) { return work.get() + (local * gz + node) * block; };
      auto of_rank = [&](float* base, size_t local, size_t node) {
        return base + static_cast<size_t>(rank_at[node * Lz + local]) * block;
      };
      const size_t ml = static_cast<size_t>(m), ll = static_cast<size_t>(l);
      std::vector<std::pair<std::string, std::function<Traffic()>>> phases;
      if (operation == Operation::allreduce) {
        float* mine = out.get() + ll * shard;
        phases = {{"intra reduce_scatter", [&, mine] {
                     std::memcpy(out.get(), in.get(), S);
                     return done(intra.reduce_scatter(intra_algo, out.get(), mine, shard, kFloat, kSum));
                   }},
                  {"inter allreduce", [&, mine] { return done(inter.allreduce(Algo::ring, mine, mine, shard, kFloat, kSum)); }},
                  {"intra allgather", [&, mine] { return done(intra.allgather(intra_algo, mine, out.get(), shard, kFloat)); }}};
      } else if (operation == Operation::reduce_scatter) {
        float* super = arranged(ll, 0);
        phases = {{"intra reduce_scatter", [&, super] {
                     for (size_t a = 0; a < Lz; ++a)
                       for (size_t k = 0; k < gz; ++k) std::memcpy(arranged(a, k), of_rank(in.get(), a, k), B);
                     return done(intra.reduce_scatter(intra_algo, work.get(), super, gz * block, kFloat, kSum));
                   }},
                  {"inter reduce_scatter", [&, super] {
                     Traffic t = done(inter.reduce_scatter(Algo::ring, super, super + ml * block, block, kFloat, kSum));
                     std::memcpy(out.get(), super + ml * block, B);
                     return t;
                   }}};
      } else {
        phases = {{"inter allgather", [&] {
                     std::memcpy(arranged(ll, ml), in.get(), B);
                     return done(inter.allgather(Algo::ring, arranged(ll, ml), arranged(ll, 0), block, kFloat));
                   }},
                  {"intra allgather", [&] {
                     Traffic t = done(intra.allgather(intra_algo, arranged(ll, 0), work.get(), gz * block, kFloat));
                     for (size_t a = 0; a < Lz; ++a)
                       for (size_t k = 0; k < gz; ++k) std::memcpy(of_rank(out.get(), a, k), arranged(a, k), B);
                     return t;
                   }}};
      }

      Row row{S, {}, chunks};
      if (wants("horing")) row.contenders.emplace_back("horing", algorithm(Algo::horing), two_level);
      if (wants("hierarchical")) row.contenders.emplace_back("hierarchical", algorithm(Algo::hierarchical), two_level);
      if (wants("ring")) row.contenders.emplace_back("ring", algorithm(Algo::ring), ring);
      if (wants("phases"))
        for (size_t p = 0; p < phases.size(); ++p)
          row.contenders.emplace_back(phases[p].first, phases[p].second, phase_formula[p], true);
      auto call = [](Contender& c) {
        c.last = c.call();
        c.sent += c.last;
        ++c.calls;
      };

      // Samples, each the max over ranks of a loop of back-to-back calls (at least ~4 MiB moved).
      const int per_sample = static_cast<int>(std::clamp<size_t>((size_t{4} << 20) / S, 1, 64));
      for (int round = 0; round < rounds; ++round)
        for (Contender& c : row.contenders) {
          auto s = measure(MPI_COMM_WORLD, MeasureSpec{round == 0 ? 2 : 0, iters, 0, per_sample}, timer, [&] {
            for (int k = 0; k < per_sample; ++k) call(c);
          });
          for (double& t : s) t = allreduce_max(MPI_COMM_WORLD, t);
          c.samples.insert(c.samples.end(), s.begin(), s.end());
        }

      // Each algorithm's result, and the phases' one after another, against the exact one.
      auto check = [&](const std::string& what) {
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
        if (wrong) throw RuntimeError(what + " " + op_name + " of " + human_bytes(S) + ": " + std::to_string(wrong) +
                                      " wrong elements on rank " + std::to_string(rank));
      };
      bool phases_checked = false;
      for (Contender& c : row.contenders) {
        std::memset(out.get(), 0, (operation == Operation::reduce_scatter ? B : S));
        if (!c.phase) {
          call(c);
          check(c.name);
        } else if (!phases_checked) {
          for (Contender& p : row.contenders)
            if (p.phase) call(p);
          check("the phases of the two-level");
          phases_checked = true;
        }
      }
      rows.push_back(std::move(row));
    }

    // Rank 0 prints; every rank takes part in the sums over ranks.
    bool op_bytes_match = true;
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
      say("%9s %6zu %11s %11s %11s %11s %9s %9s %9s %9s\n", human_bytes(row.bytes).c_str(), row.chunks,
          cell(horing).c_str(), cell(hier).c_str(), cell(ring_time).c_str(), cell(phases_sum).c_str(),
          cell_ratio(ratio(horing, hier)).c_str(), cell_ratio(ratio(horing, ring_time)).c_str(),
          cell_ratio(ratio(horing, phases_sum)).c_str(), cell_ratio(ratio(hier, phases_sum)).c_str());
      nlohmann::json json_row = {{"operation", op_name}, {"bytes", row.bytes}, {"chunks", row.chunks},
                                 {"phases_sum_s", phases_sum}, {"phases", nlohmann::json::array()},
                                 {"median_s", nlohmann::json::object()},
                                 {"traffic", nlohmann::json::object()}};
      for (Contender& c : row.contenders) {
        // Bytes per tier summed over ranks, counted and by formula, in the last call.
        uint64_t sums[4] = {c.last.intra_bytes, c.last.inter_bytes, c.formula.intra_bytes, c.formula.inter_bytes};
        STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums, 4, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD));
        const bool match = sums[0] == sums[2] && sums[1] == sums[3];
        op_bytes_match = op_bytes_match && match;
        json_row["median_s"][c.name] = median[c.name];
        if (c.phase) json_row["phases"].push_back(c.name);  // in the algorithm's order
        json_row["traffic"][c.name] = {{"intra_per_rank", sums[0] / static_cast<double>(size)},
                                       {"inter_per_rank", sums[1] / static_cast<double>(size)},
                                       {"intra_formula_per_rank", sums[2] / static_cast<double>(size)},
                                       {"inter_formula_per_rank", sums[3] / static_cast<double>(size)},
                                       {"match", match}};
        auto& [counted, formula] = sent_by[c.phase ? "phases" : c.name];
        counted += c.sent;
        formula += Traffic{c.formula.intra_bytes * static_cast<uint64_t>(c.calls),
                           c.formula.inter_bytes * static_cast<uint64_t>(c.calls)};
      }
      report["rows"].push_back(json_row);
    }
    // Bytes per tier of the largest size, per rank (mean over ranks), beside the formula.
    Row& last = rows.back();
    say("# bytes per rank at %s (mean over ranks), counted / formula:\n", human_bytes(last.bytes).c_str());
    for (Contender& c : last.contenders) {
      uint64_t sums[4] = {c.last.intra_bytes, c.last.inter_bytes, c.formula.intra_bytes, c.formula.inter_bytes};
      STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, sums, 4, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD));
      say("#   %-22s intra %12.0f / %12.0f   inter %12.0f / %12.0f\n", c.name.c_str(), sums[0] / double(size),
          sums[2] / double(size), sums[1] / double(size), sums[3] / double(size));
    }
    say("%s: bytes per tier equal the formula for every algorithm, phase and size: %s\n", op_name.c_str(),
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
  if (rank == 0 && !json_path.empty()) {
    std::ofstream file(json_path);
    file << report.dump(1) << "\n";
    if (!file) throw RuntimeError("cannot write " + json_path);
  }
  say("\n# results exact for every algorithm and the phases; the speed ratios are reported, not judged%s\n",
      ranks_per_node > 0 ? " (emulated nodes: both tiers are shared memory on one machine)" : "");
  STRATA_MPI_CHECK(MPI_Bcast(&missed, 1, MPI_INT, 0, MPI_COMM_WORLD));
  if (smoke) say("HO-Ring against hierarchical, its phases and a flat ring: smoke, not judged\n");
  if (missed && !smoke) say("%d figure(s) missed their target\n", missed);
  return missed && !smoke ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  return strata::program_main(argc, argv, "strata-bench-horing", [&] { return run_targets(argc, argv); });
}
