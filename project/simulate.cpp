#include "project/simulate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <set>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <utility>

namespace strata::project {

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::timed: return "timed";
    case OpKind::gemm: return "gemm";
    case OpKind::attention: return "attention";
    case OpKind::elementwise: return "elementwise";
    case OpKind::collective: return "collective";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
  }
  return "?";
}

bool is_compute(OpKind kind) {
  return kind == OpKind::timed || kind == OpKind::gemm || kind == OpKind::attention || kind == OpKind::elementwise;
}

Op timed_op(std::string name, double seconds, int stream) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::timed;
  op.seconds = seconds;
  op.stream = stream;
  return op;
}

Op gemm_op(std::string name, std::int64_t m, std::int64_t n, std::int64_t k, std::string dtype) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::gemm;
  op.m = m;
  op.n = n;
  op.k = k;
  op.dtype = std::move(dtype);
  return op;
}

Op attention_op(std::string name, std::int64_t batch, std::int64_t heads, std::int64_t seq_q, std::int64_t seq_kv,
                std::int64_t head_dim, bool causal, bool backward, std::string dtype) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::attention;
  op.batch = batch;
  op.heads = heads;
  op.seq_q = seq_q;
  op.seq_kv = seq_kv;
  op.head_dim = head_dim;
  op.causal = causal;
  op.backward = backward;
  op.dtype = std::move(dtype);
  return op;
}

Op elementwise_op(std::string name, double bytes) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::elementwise;
  op.bytes = bytes;
  return op;
}

Op collective_op(std::string name, coll::Operation collective, int group, double bytes) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::collective;
  op.collective = collective;
  op.group = group;
  op.bytes = bytes;
  op.stream = communication_stream(group);
  return op;
}

Op send_op(std::string name, int peer, double bytes, int stream) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::send;
  op.peer = peer;
  op.bytes = bytes;
  op.stream = stream;
  return op;
}

Op recv_op(std::string name, int peer, double bytes, int stream) {
  Op op = send_op(std::move(name), peer, bytes, stream);
  op.kind = OpKind::recv;
  return op;
}

double attention_flops(const Op& op) {
  const double forward = 4.0 * static_cast<double>(op.batch) * static_cast<double>(op.heads) *
                         static_cast<double>(op.seq_q) * static_cast<double>(op.seq_kv) *
                         static_cast<double>(op.head_dim) * (op.causal ? 0.5 : 1.0);
  return op.backward ? 2.5 * forward : forward;
}

double compute_seconds(const System& system, const Op& op) {
  switch (op.kind) {
    case OpKind::timed: return op.seconds;
    case OpKind::gemm: return system.device.gemm_seconds(op.dtype, op.m, op.n, op.k);
    case OpKind::attention:
      if (op.unfused) return unfused_attention_seconds(system.device, op);
      return system.device.attention_seconds(
          op.dtype, {op.batch, op.heads, op.kv_heads, op.seq_q, op.seq_kv, op.head_dim, op.causal, op.backward},
          op.attention_kernel);
    case OpKind::elementwise: return system.device.elementwise_seconds(op.name, op.bytes);
    default: throw std::invalid_argument(std::string("compute_seconds of a ") + op_kind_name(op.kind) + " op");
  }
}

double unfused_attention_seconds(const Device& device, const Op& op) {
  const std::int64_t bh = op.batch * op.heads, sq = op.seq_q, skv = op.seq_kv, d = op.head_dim;
  const double scores = static_cast<double>(bh) * static_cast<double>(sq) * static_cast<double>(skv);
  constexpr double kElement = 2, kMask = 1;
  auto gemm = [&](std::int64_t m, std::int64_t n, std::int64_t k) { return device.gemm_seconds(op.dtype, m, n, k); };
  auto pass = [&](double bytes) { return device.elementwise_seconds(bytes); };
  if (!op.backward)
    return gemm(bh * sq, skv, d) + pass(2 * kElement * scores) + pass((2 * kElement + kMask) * scores) + gemm(bh * sq, d, skv);
  return gemm(bh * sq, skv, d) + pass((2 * kElement + kMask) * scores) + pass(3 * kElement * scores) + gemm(bh * sq, d, skv) +
         2 * gemm(bh * skv, d, sq);
}

// The simulator's own state (Simulation holds one, so the names are not in an anonymous namespace).
namespace simulator_detail {

enum class Status : std::uint8_t { waiting, reached, running, done };

// What a collective's duration needs of its group, looked up once: a step reaches its groups' collectives often.
struct GroupFacts {
  const Group* group = nullptr;
  int traced_members = 0;
  GroupKind kind{};
  int per_node = 0;  // its fewest members on a node
};

struct CollectiveInstance {
  std::vector<std::pair<int, int>> reached;  // (traced rank index, op index)
  const GroupFacts* facts = nullptr;
  // While running, with a communication slowdown: its alone-seconds of work left as of `since`, and the wall seconds
  // per alone-second since then (1 + the slowdown while a member computes, else 1).
  double remaining = 0, since = 0, factor = 1;
  int members_running = 0;  // its traced members whose op of it has not ended
  bool dirty = false;
};

struct Channel {  // the sends of one (from, to) pair, matched in order with the recvs
  std::vector<double> send_start;   // by sequence; NaN until it starts
  std::vector<double> transfer_s;
  std::vector<int> waiting_recv;    // op index of the recv reached before its send started, or -1
  std::vector<double> bytes;        // of each send
  bool same_node = false;
};

struct OpState {  // one cache line: a step's ops are many, and the simulation walks them all
  double remaining = 0;  // compute: alone-seconds of work left
  double since = 0;      // compute (event queue): `remaining` holds as of this time
  CollectiveInstance* instance = nullptr;  // collective: its instance across the group
  Channel* channel = nullptr;              // send, recv: its (from, to) channel
  int sequence = -1;     // collective: its number on its group; send/recv: its number on its (from, to) channel
  int queue = 0;         // its stream's place in RankState::queues
  int pending = 0;       // the ops it depends on that have not ended
  int peer_index = -1;   // send: the traced index of the receiving rank
  unsigned stamp = 0;    // event queue: the version of its pending end event
  int dependencies = 0;  // the ops it depends on: `pending` before a run
  OpKind kind = OpKind::timed;  // the op's, here so that reaching a compute op reads no more than this state
  Status status = Status::waiting;
  bool compute = false;
};

// One stream of a rank: its ops in the rank's order, and the first not done.
struct Queue {
  int stream = 0;
  std::vector<int> ops;
  size_t head = 0;
};

struct RankState {
  std::vector<Queue> queues;               // by first appearance of the stream in the rank's list
  // Per op i: the later ops that depend on it, dependents[dependents_from[i] .. dependents_from[i + 1]).
  std::vector<int> dependents_from, dependents;
  std::vector<OpState> ops;
  int communication_running = 0;
  std::vector<int> running_compute;  // event queue: its compute ops now running
  int compute_running = 0;           // its compute ops now running (both methods)
  std::vector<CollectiveInstance*> running_collectives;  // with a communication slowdown: its collectives running
};

// A pending end of a running op (event queue): stale once the op's stamp has moved on.
struct Event {
  double time;
  std::uint32_t rank;
  int op;
  unsigned stamp;
  bool operator>(const Event& other) const { return time > other.time; }
};

std::string where(const RankGraph& g, int i) {
  return "rank " + std::to_string(g.rank) + " op " + std::to_string(i) + " (" + g.ops[static_cast<size_t>(i)].name +
         ")";
}



class Simulator {
 public:
  Simulator(const System& system, const Workload& workload)
      : system_(&system), workload_(workload), slowdown_(1 + system.overlap_slowdown.value),
        communication_slowdown_(communication_slowdown_of(system)) {
    if (auto problem = find_problem(system)) throw std::invalid_argument("system description: " + *problem);
    index_ranks();
    index_groups();
    index_ops();
    prepared_ = true;
  }

  // Everything that depends on the description or on the workload's durations, afresh: the state before a run.
  void prepare(const System& system) {
    if (auto problem = find_problem(system)) throw std::invalid_argument("system description: " + *problem);
    if (system.device.devices_per_node != system_->device.devices_per_node)
      throw std::logic_error("simulation: a description with other nodes than the one the workload was indexed on");
    system_ = &system;
    slowdown_ = 1 + system.overlap_slowdown.value;
    communication_slowdown_ = communication_slowdown_of(system);
    for (size_t r = 0; r < state_.size(); ++r) {
      RankState& rs = state_[r];
      const RankGraph& g = workload_.ranks[r];
      for (size_t i = 0; i < rs.ops.size(); ++i) {
        OpState& s = rs.ops[i];
        s.status = Status::waiting;
        s.pending = s.dependencies;
        s.since = 0;
        if (s.compute) s.remaining = alone_seconds(g, static_cast<int>(i));
      }
      for (Queue& q : rs.queues) q.head = 0;
      rs.communication_running = 0;
      rs.running_compute.clear();
      rs.compute_running = 0;
      rs.running_collectives.clear();
    }
    for (auto& [group, instances] : collectives_)
      for (CollectiveInstance& instance : instances) {
        instance.reached.clear();
        instance.remaining = instance.since = 0, instance.factor = 1;
        instance.members_running = 0, instance.dirty = false;
      }
    retimed_.clear();
    for (auto& [key, channel] : channels_) {
      std::fill(channel.send_start.begin(), channel.send_start.end(), std::numeric_limits<double>::quiet_NaN());
      std::fill(channel.waiting_recv.begin(), channel.waiting_recv.end(), -1);
      const NetworkTier& tier = channel.same_node ? system_->intra_node : system_->inter_node;
      for (size_t q = 0; q < channel.bytes.size(); ++q) channel.transfer_s[q] = tier.transfer_seconds(channel.bytes[q]);
    }
    timeline_ = Timeline{};
    running_.clear(), ending_.clear(), still_running_.clear(), events_.clear(), deferred_.clear(), dirty_.clear();
    ops_done_ = 0;
    current_ = 0;
    prepared_ = true;
  }

  Timeline run(const SimulateOptions& options) {
    if (!prepared_) throw std::logic_error("simulation: run twice without prepare");
    prepared_ = false;
    options_ = options;
    event_queue_ = options.method == SimulateMethod::event_queue;
    timeline_.ops.resize(workload_.ranks.size());
    for (size_t r = 0; r < workload_.ranks.size(); ++r) timeline_.ops[r].resize(workload_.ranks[r].ops.size());
    is_dirty_.assign(state_.size(), 0);
    for (size_t r = 0; r < state_.size(); ++r) make_dirty(r);
    double now = 0;
    while (true) {
      start_everything_reachable(now);
      retime_collectives(now);
      if (all_done()) break;
      if (event_queue_) {
        now = next_queued_event(now);
        complete_queued_at(now);
        continue;
      }
      const double next = next_event(now);
      advance_compute(now, next);
      now = next;
      complete_at(now);
    }
    finish();
    return std::move(timeline_);
  }

 private:
  const System* system_;
  const Workload& workload_;
  SimulateOptions options_;
  double slowdown_;          // a compute op's wall time per alone-second while communication runs beside it
  double communication_slowdown_;  // a collective's extra wall time per alone-second while a member computes
  std::vector<CollectiveInstance*> retimed_;  // collectives whose members' computing changed at this instant
  bool event_queue_ = true;  // SimulateMethod::event_queue
  bool prepared_ = false;
  std::vector<Event> events_;  // a min-heap on time
  std::vector<Event> deferred_;
  double current_ = 0;  // the instant being simulated (event queue): rates change from here on
  std::unordered_map<int, int> rank_index_;  // rank -> traced index
  std::vector<RankState> state_;
  std::unordered_map<int, std::vector<CollectiveInstance>> collectives_;  // group -> by sequence
  std::map<int, GroupFacts> facts_;                                       // group -> what its collectives need
  std::map<std::pair<int, int>, Channel> channels_;                 // (from rank, to rank)
  std::vector<std::pair<size_t, int>> running_;                     // (traced rank index, op)
  std::vector<std::pair<size_t, int>> ending_, still_running_;      // complete_at's, kept between events
  std::vector<size_t> dirty_;  // ranks where an op ended since their streams were last looked at
  std::vector<char> is_dirty_;
  size_t ops_total_ = 0, ops_done_ = 0;
  Timeline timeline_;

  [[noreturn]] static void refuse(const std::string& why) { throw std::invalid_argument("workload: " + why); }

  void index_ranks() {
    for (size_t r = 0; r < workload_.ranks.size(); ++r) {
      const RankGraph& g = workload_.ranks[r];
      if (g.rank < 0) refuse("rank " + std::to_string(g.rank) + " is negative");
      if (g.weight < 1) refuse("rank " + std::to_string(g.rank) + " has weight " + std::to_string(g.weight));
      if (!rank_index_.emplace(g.rank, static_cast<int>(r)).second)
        refuse("rank " + std::to_string(g.rank) + " is traced twice");
    }
  }

  void index_groups() {
    for (const Group& group : workload_.groups) {
      if (facts_.count(group.id)) refuse("group " + std::to_string(group.id) + " is given twice");
      std::set<int> members(group.ranks.begin(), group.ranks.end());
      if (members.empty() || members.size() != group.ranks.size() || *members.begin() < 0)
        refuse("group " + std::to_string(group.id) + " must list distinct non-negative ranks");
      int traced = 0;
      for (int rank : group.ranks) traced += rank_index_.count(rank) ? 1 : 0;
      std::vector<int> nodes;
      for (int rank : group.ranks) nodes.push_back(rank / system_->device.devices_per_node);
      facts_[group.id] = {&group, traced, group_kind_of(nodes), members_per_node(nodes)};
    }
  }

  double alone_seconds(const RankGraph& g, int i) const {
    const Op& op = g.ops[static_cast<size_t>(i)];
    const double t = compute_seconds(*system_, op);
    if (!std::isfinite(t) || t < 0 || op.seconds < 0 || op.bytes < 0 || op.m < 0 || op.n < 0 || op.k < 0)
      refuse(where(g, i) + " has a negative size or duration");
    return t;
  }

  bool same_node(int a, int b) const {
    return a / system_->device.devices_per_node == b / system_->device.devices_per_node;
  }

  void index_ops() {
    // (group) -> the collectives of each traced member in order, to check they match across the group.
    std::map<int, std::vector<std::pair<int, std::vector<int>>>> by_group;
    std::map<std::pair<int, int>, std::vector<std::pair<int, int>>> sends, recvs;  // (from, to) -> (rank idx, op)
    state_.resize(workload_.ranks.size());
    for (size_t r = 0; r < workload_.ranks.size(); ++r) {
      const RankGraph& g = workload_.ranks[r];
      RankState& s = state_[r];
      s.ops.resize(g.ops.size());
      s.dependents_from.assign(g.ops.size() + 1, 0);
      for (size_t i = 0; i < g.ops.size(); ++i)
        for (int d : g.ops[i].depends_on)
          if (d >= 0 && d < static_cast<int>(i)) ++s.dependents_from[static_cast<size_t>(d) + 1];
      for (size_t i = 0; i < g.ops.size(); ++i) s.dependents_from[i + 1] += s.dependents_from[i];
      s.dependents.resize(static_cast<size_t>(s.dependents_from.back()));
      std::vector<int> filled(s.dependents_from.begin(), s.dependents_from.end() - 1);
      ops_total_ += g.ops.size();
      std::map<int, std::vector<int>> collectives_of_group;
      std::unordered_map<int, int> queue_of_stream;
      for (size_t i = 0; i < g.ops.size(); ++i) {
        const Op& op = g.ops[i];
        const int oi = static_cast<int>(i);
        for (int d : op.depends_on) {
          if (d < 0 || d >= oi) refuse(where(g, oi) + " depends on op " + std::to_string(d) + ", not an earlier op");
          s.dependents[static_cast<size_t>(filled[static_cast<size_t>(d)]++)] = oi;
        }
        s.ops[i].pending = s.ops[i].dependencies = static_cast<int>(op.depends_on.size());
        s.ops[i].kind = op.kind;
        const auto [queue, added] = queue_of_stream.emplace(op.stream, static_cast<int>(s.queues.size()));
        if (added) s.queues.push_back({op.stream, {}, 0});
        s.queues[static_cast<size_t>(queue->second)].ops.push_back(oi);
        s.ops[i].queue = queue->second;
        s.ops[i].compute = is_compute(op.kind);
        if (is_compute(op.kind)) {
          s.ops[i].remaining = alone_seconds(g, oi);
        } else if (op.kind == OpKind::collective) {
          const auto group = facts_.find(op.group);
          if (group == facts_.end()) refuse(where(g, oi) + " names group " + std::to_string(op.group) + ", unknown");
          const auto& members = group->second.group->ranks;
          if (std::find(members.begin(), members.end(), g.rank) == members.end())
            refuse(where(g, oi) + " is on group " + std::to_string(op.group) + ", which rank " +
                   std::to_string(g.rank) + " is not a member of");
          if (!(op.bytes >= 0)) refuse(where(g, oi) + " has negative bytes");
          auto& list = collectives_of_group[op.group];
          s.ops[i].sequence = static_cast<int>(list.size());
          list.push_back(oi);
        } else {
          if (!rank_index_.count(op.peer) || op.peer == g.rank)
            refuse(where(g, oi) + " has peer " + std::to_string(op.peer) + ", not another traced rank");
          if (!(op.bytes >= 0)) refuse(where(g, oi) + " has negative bytes");
          auto& list = op.kind == OpKind::send ? sends[{g.rank, op.peer}] : recvs[{op.peer, g.rank}];
          s.ops[i].sequence = static_cast<int>(list.size());
          list.emplace_back(static_cast<int>(r), oi);
        }
      }
      for (auto& [group, ops] : collectives_of_group) by_group[group].emplace_back(static_cast<int>(r), ops);
    }
    check_collectives_match(by_group);
    check_transfers_match(sends, recvs);
    // Each op's instance and channel, now that their containers no longer grow.
    for (size_t r = 0; r < workload_.ranks.size(); ++r) {
      const RankGraph& g = workload_.ranks[r];
      for (size_t i = 0; i < g.ops.size(); ++i) {
        const Op& op = g.ops[i];
        OpState& st = state_[r].ops[i];
        if (op.kind == OpKind::collective) {
          st.instance = &collectives_.at(op.group).at(static_cast<size_t>(st.sequence));
          st.instance->facts = &facts_.at(op.group);
        } else if (op.kind == OpKind::send) {
          st.channel = &channels_.at({g.rank, op.peer});
          st.peer_index = rank_index_.at(op.peer);
        } else if (op.kind == OpKind::recv) {
          st.channel = &channels_.at({op.peer, g.rank});
        }
      }
    }
  }

  void check_collectives_match(const std::map<int, std::vector<std::pair<int, std::vector<int>>>>& by_group) {
    for (const auto& [group, members] : by_group) {
      const auto& [first_rank, first_ops] = members.front();
      const RankGraph& a = workload_.ranks[static_cast<size_t>(first_rank)];
      if (static_cast<int>(members.size()) != facts_[group].traced_members)
        refuse("group " + std::to_string(group) + ": rank " + std::to_string(a.rank) +
               " has collectives on it, some other traced member has none");
      for (const auto& [rank, ops] : members) {
        const RankGraph& b = workload_.ranks[static_cast<size_t>(rank)];
        if (ops.size() != first_ops.size())
          refuse("group " + std::to_string(group) + ": rank " + std::to_string(a.rank) + " has " +
                 std::to_string(first_ops.size()) + " collectives on it, rank " + std::to_string(b.rank) + " " +
                 std::to_string(ops.size()));
        for (size_t q = 0; q < ops.size(); ++q) {
          const Op& x = a.ops[static_cast<size_t>(first_ops[q])];
          const Op& y = b.ops[static_cast<size_t>(ops[q])];
          if (x.collective != y.collective || x.bytes != y.bytes || x.algorithm != y.algorithm)
            refuse("group " + std::to_string(group) + " collective #" + std::to_string(q) + ": " +
                   where(a, first_ops[q]) + " is a " + std::string(coll::name(x.collective)) + " of " +
                   std::to_string(x.bytes) + " B, " + where(b, ops[q]) + " a " + std::string(coll::name(y.collective)) +
                   " of " + std::to_string(y.bytes) + " B");
        }
      }
      collectives_[group].resize(first_ops.size());
    }
  }

  void check_transfers_match(const std::map<std::pair<int, int>, std::vector<std::pair<int, int>>>& sends,
                             const std::map<std::pair<int, int>, std::vector<std::pair<int, int>>>& recvs) {
    std::set<std::pair<int, int>> pairs;
    for (const auto& [key, list] : sends) pairs.insert(key);
    for (const auto& [key, list] : recvs) pairs.insert(key);
    for (const auto& key : pairs) {
      const auto s = sends.find(key);
      const auto r = recvs.find(key);
      const size_t ns = s == sends.end() ? 0 : s->second.size();
      const size_t nr = r == recvs.end() ? 0 : r->second.size();
      if (ns != nr)
        refuse("rank " + std::to_string(key.first) + " sends " + std::to_string(ns) + " times to rank " +
               std::to_string(key.second) + ", which receives " + std::to_string(nr) + " times from it");
      Channel& channel = channels_[key];
      channel.send_start.assign(ns, std::numeric_limits<double>::quiet_NaN());
      channel.transfer_s.resize(ns);
      channel.waiting_recv.assign(ns, -1);
      channel.same_node = same_node(key.first, key.second);
      channel.bytes.resize(ns);
      const NetworkTier& tier = channel.same_node ? system_->intra_node : system_->inter_node;
      for (size_t q = 0; q < ns; ++q) {
        const auto [sr, so] = s->second[q];
        const auto [rr, ro] = r->second[q];
        const Op& send = workload_.ranks[static_cast<size_t>(sr)].ops[static_cast<size_t>(so)];
        const Op& recv = workload_.ranks[static_cast<size_t>(rr)].ops[static_cast<size_t>(ro)];
        if (send.bytes != recv.bytes)
          refuse(where(workload_.ranks[static_cast<size_t>(sr)], so) + " sends " + std::to_string(send.bytes) +
                 " B, " + where(workload_.ranks[static_cast<size_t>(rr)], ro) + " receives " +
                 std::to_string(recv.bytes) + " B");
        channel.bytes[q] = send.bytes;
        channel.transfer_s[q] = tier.transfer_seconds(send.bytes);
      }
    }
  }

  void make_dirty(size_t r) {
    if (is_dirty_[r]) return;
    is_dirty_[r] = 1;
    dirty_.push_back(r);
  }

  bool all_done() const { return ops_done_ == ops_total_; }

  void begin_communication(size_t r, int i, double start, double end) {
    OpState& s = state_[r].ops[static_cast<size_t>(i)];
    OpTiming& t = timeline_.ops[r][static_cast<size_t>(i)];
    t.start = start;
    t.end = end;
    s.status = Status::running;
    if (event_queue_) {
      if (state_[r].communication_running == 0) change_rate(r, current_, 1, slowdown_);
      ++state_[r].communication_running;
      push_event(r, i, end);
      return;
    }
    ++state_[r].communication_running;
    running_.emplace_back(r, i);
  }

  void mark_done(size_t r, int i, double end) {
    RankState& rs = state_[r];
    OpState& s = rs.ops[static_cast<size_t>(i)];
    if (s.status == Status::running && !s.compute) {
      --rs.communication_running;
      if (event_queue_ && rs.communication_running == 0) change_rate(r, current_, slowdown_, 1);
      if (s.instance && s.instance->members_running > 0) {
        std::vector<CollectiveInstance*>& list = rs.running_collectives;
        list.erase(std::find(list.begin(), list.end(), s.instance));
        --s.instance->members_running;
      }
    } else if (s.status == Status::running) {
      compute_stopped(r);
    }
    s.status = Status::done;
    timeline_.ops[r][static_cast<size_t>(i)].end = end;
    ++ops_done_;
    ++rs.queues[static_cast<size_t>(s.queue)].head;
    for (int k = rs.dependents_from[static_cast<size_t>(i)]; k < rs.dependents_from[static_cast<size_t>(i) + 1]; ++k)
      --rs.ops[static_cast<size_t>(rs.dependents[static_cast<size_t>(k)])].pending;
    make_dirty(r);
  }

  // Reaches every op whose stream is free and whose dependencies are done, on every rank where an op ended,
  // until nothing more changes (zero-time ops may free further ops at the same instant).
  void start_everything_reachable(double now) {
    while (!dirty_.empty()) {
      const size_t r = dirty_.back();
      dirty_.pop_back();
      is_dirty_[r] = 0;
      RankState& rs = state_[r];
      for (size_t q = 0; q < rs.queues.size(); ++q) {
        const Queue& queue = rs.queues[q];
        if (queue.head >= queue.ops.size()) continue;
        const int i = queue.ops[queue.head];
        const OpState& s = rs.ops[static_cast<size_t>(i)];
        if (s.status == Status::waiting && s.pending == 0) reach(r, i, now);
      }
    }
  }

  void reach(size_t r, int i, double now) {
    OpState& s = state_[r].ops[static_cast<size_t>(i)];
    OpTiming& t = timeline_.ops[r][static_cast<size_t>(i)];
    t.reached = now;
    t.start = now;
    s.status = Status::reached;
    if (s.compute) {
      if (s.remaining == 0) {
        mark_done(r, i, now);
        return;
      }
      s.status = Status::running;
      compute_started(r);
      if (event_queue_) {
        s.since = now;
        state_[r].running_compute.push_back(i);
        push_event(r, i, now + s.remaining * slowdown_factor(r));
      } else {
        running_.emplace_back(r, i);
      }
    } else if (s.kind == OpKind::collective) {
      CollectiveInstance& instance = *s.instance;
      instance.reached.emplace_back(static_cast<int>(r), i);
      const GroupFacts& facts = *instance.facts;
      if (static_cast<int>(instance.reached.size()) == facts.traced_members) {
        const Op& op = workload_.ranks[r].ops[static_cast<size_t>(i)];
        const double duration = system_->collective_seconds(op.collective, op.algorithm, facts.kind, op.bytes,
                                                           static_cast<int>(facts.group->ranks.size()), facts.per_node,
                                                           op.blocking);
        double end = now + duration;
        if (communication_slowdown_ > 0) {
          instance.remaining = duration, instance.since = now;
          instance.members_running = static_cast<int>(instance.reached.size());
          instance.factor = factor_of(instance);
          end = now + duration * instance.factor;
          for (const auto& [mr, mi] : instance.reached) state_[static_cast<size_t>(mr)].running_collectives.push_back(&instance);
        }
        for (const auto& [mr, mi] : instance.reached) begin_communication(static_cast<size_t>(mr), mi, now, end);
      }
    } else if (s.kind == OpKind::send) {
      Channel& channel = *s.channel;
      const auto q = static_cast<size_t>(s.sequence);
      channel.send_start[q] = now;
      begin_communication(r, i, now, now + channel.transfer_s[q]);
      if (channel.waiting_recv[q] >= 0)
        begin_communication(static_cast<size_t>(s.peer_index), channel.waiting_recv[q], now, now + channel.transfer_s[q]);
    } else {  // recv
      Channel& channel = *s.channel;
      const auto q = static_cast<size_t>(s.sequence);
      if (std::isnan(channel.send_start[q])) {
        channel.waiting_recv[q] = i;
      } else {
        const double arrival = channel.send_start[q] + channel.transfer_s[q];
        if (arrival > now) begin_communication(r, i, now, arrival);
        else mark_done(r, i, now);
      }
    }
  }

  // ---- collectives slowed by compute (System::communication_slowdown) ----
  // A running collective's rate changes only when one of its members starts or stops computing; the changes of an
  // instant are gathered and applied after every op it frees has started, so ops back to back on a stream do not
  // move it.

  static double communication_slowdown_of(const System& system) {
    return system.communication_slowdown ? std::max(0.0, system.communication_slowdown->value) : 0;
  }

  double factor_of(const CollectiveInstance& instance) const {
    for (const auto& [mr, mi] : instance.reached)
      if (state_[static_cast<size_t>(mr)].compute_running > 0) return 1 + communication_slowdown_;
    return 1;
  }

  void mark_retime(size_t r) {
    for (CollectiveInstance* instance : state_[r].running_collectives)
      if (!instance->dirty) instance->dirty = true, retimed_.push_back(instance);
  }

  void compute_started(size_t r) {
    if (++state_[r].compute_running == 1) mark_retime(r);
  }

  void compute_stopped(size_t r) {
    if (--state_[r].compute_running == 0) mark_retime(r);
  }

  void retime_collectives(double now) {
    for (CollectiveInstance* instance : retimed_) {
      instance->dirty = false;
      if (instance->members_running == 0) continue;
      const double factor = factor_of(*instance);
      if (factor == instance->factor) continue;
      instance->remaining = std::max(0.0, instance->remaining - (now - instance->since) / instance->factor);
      instance->since = now, instance->factor = factor;
      const double end = now + instance->remaining * factor;
      for (const auto& [mr, mi] : instance->reached) {
        timeline_.ops[static_cast<size_t>(mr)][static_cast<size_t>(mi)].end = end;
        if (event_queue_) push_event(static_cast<size_t>(mr), mi, end);
      }
    }
    retimed_.clear();
  }

  double slowdown_factor(size_t r) const { return state_[r].communication_running > 0 ? slowdown_ : 1; }

  double next_event(double now) const {
    double next = std::numeric_limits<double>::infinity();
    for (const auto& [r, i] : running_) {
      const OpState& s = state_[r].ops[static_cast<size_t>(i)];
      next = std::min(next, s.compute ? now + s.remaining * slowdown_factor(r)
                                : timeline_.ops[r][static_cast<size_t>(i)].end);
    }
    if (!std::isfinite(next)) {
      std::string stuck;
      for (size_t r = 0; r < state_.size() && stuck.size() < 400; ++r)
        for (size_t i = 0; i < state_[r].ops.size(); ++i)
          if (state_[r].ops[i].status == Status::reached) stuck += "\n  " + where(workload_.ranks[r], static_cast<int>(i));
      refuse("the step deadlocks at " + std::to_string(now) + " s; waiting:" + stuck);
    }
    return next;
  }

  void advance_compute(double now, double next) {
    for (const auto& [r, i] : running_) {
      OpState& s = state_[r].ops[static_cast<size_t>(i)];
      if (s.compute) s.remaining = std::max(0.0, s.remaining - (next - now) / slowdown_factor(r));
    }
  }

  void complete_at(double now) {
    // Work left below this many alone-seconds is rounding in the subtraction above, not work.
    const double tolerance = 1e-12 * std::max(1.0, now);
    // The rates of every op on a rank hold until the next event, so all ops ending now are marked before any
    // rank's counts change.
    ending_.clear(), still_running_.clear();
    for (const auto& [r, i] : running_) {
      const OpState& s = state_[r].ops[static_cast<size_t>(i)];
      const bool ends = s.compute ? s.remaining <= tolerance : timeline_.ops[r][static_cast<size_t>(i)].end <= now;
      (ends ? ending_ : still_running_).emplace_back(r, i);
    }
    running_.swap(still_running_);
    for (const auto& [r, i] : ending_) {
      const bool compute = state_[r].ops[static_cast<size_t>(i)].compute;
      mark_done(r, i, compute ? now : timeline_.ops[r][static_cast<size_t>(i)].end);
    }
  }

  // ---- the event queue (SimulateMethod::event_queue) ----
  // A rank's rate changes only when communication starts or stops on it, so each running compute op keeps its work
  // left as of the last change (`since`) and one pending end event; a change brings the work up to date at the old
  // rate and re-queues the end at the new one.

  void push_event(size_t r, int i, double time) {
    OpState& s = state_[r].ops[static_cast<size_t>(i)];
    events_.push_back({time, static_cast<std::uint32_t>(r), i, ++s.stamp});
    std::push_heap(events_.begin(), events_.end(), std::greater<>());
  }

  void change_rate(size_t r, double now, double old_factor, double new_factor) {
    for (int i : state_[r].running_compute) {
      OpState& s = state_[r].ops[static_cast<size_t>(i)];
      s.remaining = std::max(0.0, s.remaining - (now - s.since) / old_factor);
      s.since = now;
      push_event(r, i, now + s.remaining * new_factor);
    }
  }

  bool is_current(const Event& e) const {
    const OpState& s = state_[e.rank].ops[static_cast<size_t>(e.op)];
    return s.status == Status::running && s.stamp == e.stamp;
  }

  void drop_stale_events() {
    while (!events_.empty() && !is_current(events_.front())) {
      std::pop_heap(events_.begin(), events_.end(), std::greater<>());
      events_.pop_back();
    }
  }

  double next_queued_event(double now) {
    drop_stale_events();
    if (events_.empty()) next_event(now);  // refuses: the step deadlocks
    return events_.front().time;
  }

  // Every op that ends at `now`: communication whose end has come, compute whose work left is below the tolerance
  // of complete_at. All are taken off the running lists before any rank's rate changes, as complete_at does.
  void complete_queued_at(double now) {
    current_ = now;
    const double tolerance = 1e-12 * std::max(1.0, now);
    const double horizon = now + tolerance * std::max(1.0, slowdown_);
    ending_.clear(), deferred_.clear();
    while (!events_.empty() && events_.front().time <= horizon) {
      const Event e = events_.front();
      std::pop_heap(events_.begin(), events_.end(), std::greater<>());
      events_.pop_back();
      if (!is_current(e)) continue;
      OpState& s = state_[e.rank].ops[static_cast<size_t>(e.op)];
      bool ends;
      if (s.compute) {
        const double left = std::max(0.0, s.remaining - (now - s.since) / slowdown_factor(e.rank));
        ends = left <= tolerance;
      } else {
        ends = timeline_.ops[e.rank][static_cast<size_t>(e.op)].end <= now;
      }
      if (ends) ending_.emplace_back(e.rank, e.op);
      else deferred_.push_back(e);
    }
    for (const Event& e : deferred_) {
      events_.push_back(e);
      std::push_heap(events_.begin(), events_.end(), std::greater<>());
    }
    for (const auto& [r, i] : ending_) {
      if (!state_[r].ops[static_cast<size_t>(i)].compute) continue;
      std::vector<int>& list = state_[r].running_compute;
      list.erase(std::find(list.begin(), list.end(), i));
    }
    for (const auto& [r, i] : ending_) {
      const bool compute = state_[r].ops[static_cast<size_t>(i)].compute;
      mark_done(r, i, compute ? now : timeline_.ops[r][static_cast<size_t>(i)].end);
    }
  }

  void finish() {
    double step = 0;
    for (const auto& rank : timeline_.ops)
      for (const OpTiming& t : rank) step = std::max(step, t.end);
    timeline_.step_s = step;
    if (options_.intervals) {
      size_t total = 0;
      for (const RankGraph& g : workload_.ranks) total += g.ops.size();
      timeline_.intervals.reserve(total);
      for (size_t r = 0; r < workload_.ranks.size(); ++r) {
        const RankGraph& g = workload_.ranks[r];
        for (size_t i = 0; i < g.ops.size(); ++i) {
          const OpTiming& t = timeline_.ops[r][i];
          timeline_.intervals.push_back({g.rank, g.ops[i].stream, g.ops[i].name, g.ops[i].kind, t.start, t.end});
        }
      }
    }
    if (!options_.breakdown) return;
    double total_weight = 0;
    for (size_t r = 0; r < workload_.ranks.size(); ++r) {
      const RankGraph& g = workload_.ranks[r];
      timeline_.breakdown.push_back(breakdown_of(r));
      const Breakdown& b = timeline_.breakdown.back();
      const double w = g.weight;
      total_weight += w;
      timeline_.mean.compute_s += w * b.compute_s;
      timeline_.mean.idle_s += w * b.idle_s;
      for (const auto& [group, seconds] : b.exposed_communication_s) timeline_.mean.exposed_communication_s[group] += w * seconds;
    }
    if (total_weight > 0) {
      timeline_.mean.compute_s /= total_weight;
      timeline_.mean.idle_s /= total_weight;
      for (auto& [group, seconds] : timeline_.mean.exposed_communication_s) seconds /= total_weight;
    }
  }

  // A sweep over the rank's interval boundaries with the set of running compute and communication ops.
  Breakdown breakdown_of(size_t r) const {
    const RankGraph& g = workload_.ranks[r];
    struct Edge {
      double time;
      bool opens;
      bool compute;
      double start;
      int group;
    };
    std::vector<Edge> edges;
    for (size_t i = 0; i < g.ops.size(); ++i) {
      const OpTiming& t = timeline_.ops[r][i];
      if (!(t.end > t.start)) continue;
      const Op& op = g.ops[i];
      const bool compute = is_compute(op.kind);
      const int group = op.kind == OpKind::collective ? op.group : kPointToPoint;
      edges.push_back({t.start, true, compute, t.start, group});
      edges.push_back({t.end, false, compute, t.start, group});
    }
    std::sort(edges.begin(), edges.end(), [](const Edge& a, const Edge& b) { return a.time < b.time; });
    Breakdown b;
    int compute_running = 0;
    // (start, group), in order: the first is exposed. A few at a time, so a sorted vector.
    std::vector<std::pair<double, int>> communication_running;
    double last = 0;
    auto account = [&](double until) {
      const double span = until - last;
      if (span <= 0) return;
      if (compute_running > 0) b.compute_s += span;
      else if (!communication_running.empty()) b.exposed_communication_s[communication_running.begin()->second] += span;
      else b.idle_s += span;
    };
    for (size_t e = 0; e < edges.size();) {
      account(edges[e].time);
      last = edges[e].time;
      for (; e < edges.size() && edges[e].time == last; ++e) {
        const Edge& x = edges[e];
        if (x.compute) compute_running += x.opens ? 1 : -1;
        else if (x.opens) {
          const std::pair<double, int> key{x.start, x.group};
          communication_running.insert(std::upper_bound(communication_running.begin(), communication_running.end(), key), key);
        } else {
          communication_running.erase(std::lower_bound(communication_running.begin(), communication_running.end(),
                                                       std::pair<double, int>{x.start, x.group}));
        }
      }
    }
    account(timeline_.step_s);
    return b;
  }
};

}  // namespace simulator_detail

Timeline simulate(const System& system, const Workload& workload, const SimulateOptions& options) {
  return simulator_detail::Simulator(system, workload).run(options);
}

Simulation::Simulation(const System& system, const Workload& workload)
    : simulator_(std::make_unique<simulator_detail::Simulator>(system, workload)) {}

Simulation::~Simulation() = default;

Timeline Simulation::run(const System& system, const SimulateOptions& options) {
  simulator_->prepare(system);
  return simulator_->run(options);
}

}  // namespace strata::project
