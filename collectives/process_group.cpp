// Implementation of the process groups and their non-blocking operations (see process_group.h).
#include "collectives/process_group.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <stdexcept>

#include "collectives/mpi_error.h"

namespace strata::coll {

namespace {

// Tags: collectives of a group take the group's next tag (every rank starts them in the same order);
// point-to-point messages take the next tag of the (peer, direction) pair. The two ranges never meet, and
// both stay below 32767, the smallest MPI_TAG_UB MPI allows.
constexpr int kCollectiveTagBase = 100;
constexpr int kPointToPointTagBase = 16300;
constexpr unsigned kTagSpan = 16000;

// MPI counts are ints: messages larger than this go in pieces.
constexpr std::size_t kMaxPiece = std::size_t{1} << 30;

// One communicator as an algorithm phase sees it: whom it talks to and how to count what it sends.
struct Channel {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  const std::vector<int>* nodes = nullptr;  // node of each rank of comm
  Traffic* traffic = nullptr;
  int tag = 0;
  std::size_t max_message = kMaxPiece;     // larger messages go in pieces (Group::max_message_bytes)
  std::size_t ring_segment = kMaxPiece;    // the ring reduces this much at a time (Group::ring_segment_bytes)
  // At least one byte, and an int count.
  std::size_t piece_limit() const { return std::clamp<std::size_t>(max_message, 1, INT_MAX); }
};

// Both ends of a message cut it into the same pieces: a group's settings are the same on every rank.
void post_send(Requests& q, const Channel& ch, const std::byte* buf, std::size_t bytes, int peer) {
  const std::size_t limit = ch.piece_limit();
  for (std::size_t offset = 0; offset < bytes || (bytes == 0 && offset == 0); offset += limit) {
    const int piece = static_cast<int>(std::min(limit, bytes - offset));
    STRATA_MPI_CHECK(MPI_Isend(buf + offset, piece, MPI_BYTE, peer, ch.tag, ch.comm, q.add()));
    if (bytes == 0) break;
  }
  if (ch.traffic) {
    const bool same_node = (*ch.nodes)[static_cast<std::size_t>(peer)] == (*ch.nodes)[static_cast<std::size_t>(ch.rank)];
    (same_node ? ch.traffic->intra_bytes : ch.traffic->inter_bytes) += bytes;
  }
}

void post_recv(Requests& q, const Channel& ch, std::byte* buf, std::size_t bytes, int peer) {
  const std::size_t limit = ch.piece_limit();
  for (std::size_t offset = 0; offset < bytes || (bytes == 0 && offset == 0); offset += limit) {
    const int piece = static_cast<int>(std::min(limit, bytes - offset));
    STRATA_MPI_CHECK(MPI_Irecv(buf + offset, piece, MPI_BYTE, peer, ch.tag, ch.comm, q.add()));
    if (bytes == 0) break;
  }
}

int wrap(int index, int n) { return ((index % n) + n) % n; }

// The element ranges of n blocks of a buffer, computed when asked (a step's frame holds no list): either
// `count` elements split as evenly as integers allow, or n blocks of `count` elements each.
struct Blocks {
  std::size_t count = 0;
  int n = 1;
  bool equal = false;
  std::size_t start(int b) const {
    const auto block = static_cast<std::size_t>(b);
    return equal ? count * block : count * block / static_cast<std::size_t>(n);
  }
  std::size_t length(int b) const { return start(b + 1) - start(b); }
};

Blocks even_blocks(std::size_t count, int n) { return {count, n, false}; }
Blocks equal_blocks(std::size_t block, int n) { return {block, n, true}; }

// avg reduces as sum; the caller divides once at the end.
RedOp reduction_of(RedOp op) { return op == RedOp::avg ? RedOp::sum : op; }

// ---- ring phases ------------------------------------------------------------------------------------------

// Ring reduce-scatter in place over n blocks of buf: rank r ends holding block r reduced over every rank.
// At step s rank r sends block r-1-s to the right and reduces block r-2-s from the left into its own copy, in
// segments of ch.ring_segment bytes (whole elements, at least one): every segment of the block it sends is
// posted at once, and each received segment is reduced as it arrives, so scratch holds one segment. The
// right neighbour cuts the same block into the same segments. An empty block is one empty message.
Step ring_reduce_scatter(Channel ch, std::byte* buf, Blocks blocks, DataType dtype, RedOp op, std::byte* scratch) {
  const int n = ch.size, r = ch.rank, right = wrap(r + 1, n), left = wrap(r - 1, n);
  const std::size_t esize = size_of(dtype), per_segment = std::max<std::size_t>(1, ch.ring_segment / esize);
  Requests sends, q;
  for (int s = 0; s < n - 1; ++s) {
    const int send_block = wrap(r - 1 - s, n), recv_block = wrap(r - 2 - s, n);
    const std::size_t send_length = blocks.length(send_block), recv_length = blocks.length(recv_block);
    sends.clear();
    for (std::size_t at = 0; at < send_length || at == 0; at += per_segment)
      post_send(sends, ch, buf + (blocks.start(send_block) + at) * esize,
                std::min(per_segment, send_length - at) * esize, right);
    for (std::size_t at = 0; at < recv_length || at == 0; at += per_segment) {
      const std::size_t piece = std::min(per_segment, recv_length - at);
      q.clear();
      post_recv(q, ch, scratch, piece * esize, left);
      co_await q;
      reduce_into(buf + (blocks.start(recv_block) + at) * esize, scratch, piece, dtype, op);
    }
    co_await sends;
  }
}

// Ring allgather in place: rank r holds block r; at step s it sends block r-s and receives block r-1-s.
Step ring_allgather(Channel ch, std::byte* buf, Blocks blocks, std::size_t esize) {
  const int n = ch.size, r = ch.rank, right = wrap(r + 1, n), left = wrap(r - 1, n);
  Requests q;
  for (int s = 0; s < n - 1; ++s) {
    const int send_block = wrap(r - s, n), recv_block = wrap(r - 1 - s, n);
    q.clear();
    post_recv(q, ch, buf + blocks.start(recv_block) * esize, blocks.length(recv_block) * esize, left);
    post_send(q, ch, buf + blocks.start(send_block) * esize, blocks.length(send_block) * esize, right);
    co_await q;
  }
}

Step ring_allreduce(Channel ch, std::byte* buf, std::size_t count, DataType dtype, RedOp op, std::byte* scratch) {
  const Blocks blocks = even_blocks(count, ch.size);
  co_await ring_reduce_scatter(ch, buf, blocks, dtype, op, scratch);
  co_await ring_allgather(ch, buf, blocks, size_of(dtype));
}

// A chain from the root around the ring, in segments, so every link carries a segment at once.
Step ring_broadcast(Channel ch, std::byte* buf, std::size_t bytes, int root, std::size_t segment) {
  const int n = ch.size, position = wrap(ch.rank - root, n);  // 0 at the root
  const int right = wrap(ch.rank + 1, n), left = wrap(ch.rank - 1, n);
  const bool forwards = position < n - 1;
  Requests sends, q;
  for (std::size_t offset = 0; offset < bytes; offset += segment) {
    const std::size_t piece = std::min(segment, bytes - offset);
    if (position > 0) {
      q.clear();
      post_recv(q, ch, buf + offset, piece, left);
      co_await q;
    }
    if (forwards) post_send(sends, ch, buf + offset, piece, right);
  }
  co_await sends;
}

// An operation of another kind (a shared-memory phase) as a phase of a step: progressed at each test of the
// outer operation, its bytes counted into the outer one's.
Step phase(Work work, Traffic* traffic) {
  Until complete{[&work] { return work.test(); }};
  co_await complete;
  if (traffic) *traffic += work.traffic();
}

// ---- library phases (MPI_I* collectives) ------------------------------------------------------------------

Step library_then(MPI_Request request, std::byte* avg_buf, std::size_t avg_count, DataType dtype, int ranks,
                  std::byte* copy_to, const std::byte* copy_from, std::size_t copy_bytes) {
  Requests q;
  *q.add() = request;
  co_await q;
  if (copy_to) std::memcpy(copy_to, copy_from, copy_bytes);
  if (avg_buf) finish_avg(avg_buf, avg_count, dtype, ranks);
}


// Group ranks as a (node, local index) table: rank_at[m * L + l] is the l-th rank (in group order) of the m-th
// node (in node-id order, the order of the inter communicators). Nodes must hold L ranks each.
std::vector<int> group_ranks_by_node_and_local(const std::vector<int>& node_of_rank) {
  std::map<int, std::vector<int>> members;
  for (int r = 0; r < static_cast<int>(node_of_rank.size()); ++r) members[node_of_rank[static_cast<std::size_t>(r)]].push_back(r);
  std::vector<int> rank_at;
  for (const auto& [node, ranks] : members) rank_at.insert(rank_at.end(), ranks.begin(), ranks.end());
  return rank_at;
}

// The message is built only on failure: building it on every call costs a latency-bound operation more
// than the operation's own bookkeeping.
template <typename Message>
void require(bool condition, Message message) {
  if (!condition) throw std::invalid_argument(message());
}

}  // namespace

Group::Group(std::string name, std::vector<int> world_ranks, int rank, std::vector<int> node_of_rank, GroupTrace& trace)
    : name_(std::move(name)), rank_(rank), size_(static_cast<int>(world_ranks.size())), node_of_rank_(std::move(node_of_rank)),
      trace_(&trace), world_ranks_(std::move(world_ranks)) {
  if (node_of_rank_.size() != world_ranks_.size() || rank_ < 0 || rank_ >= size_)
    throw std::invalid_argument("traced group " + name_ + ": " + std::to_string(world_ranks_.size()) + " members, " +
                                std::to_string(node_of_rank_.size()) + " nodes, rank " + std::to_string(rank_));
  std::map<int, int> per_node;
  for (int node : node_of_rank_) ++per_node[node];
  node_count_ = static_cast<int>(per_node.size());
  even_nodes_ = std::all_of(per_node.begin(), per_node.end(), [&](auto& kv) { return kv.second == per_node.begin()->second; });
  send_sequence_.assign(static_cast<std::size_t>(size_), 0);
  recv_sequence_.assign(static_cast<std::size_t>(size_), 0);
}

std::unique_ptr<Group> Group::reordered(std::string name, const std::vector<int>& key_of_rank) const {
  if (static_cast<int>(key_of_rank.size()) != size_) throw std::invalid_argument("reordered: one key per rank of " + name_);
  std::vector<int> nodes(node_of_rank_.size()), world(world_ranks_.size());
  for (int r = 0; r < size_; ++r) {
    const auto to = static_cast<std::size_t>(key_of_rank[static_cast<std::size_t>(r)]);
    if (to >= nodes.size()) throw std::invalid_argument("reordered: keys of " + name_ + " are not a permutation");
    nodes[to] = node_of_rank_[static_cast<std::size_t>(r)];
    if (trace_) world[to] = world_ranks_[static_cast<std::size_t>(r)];
  }
  const int me = key_of_rank[static_cast<std::size_t>(rank_)];
  if (trace_) return std::make_unique<Group>(std::move(name), std::move(world), me, std::move(nodes), *trace_);
  MPI_Comm comm = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_split(comm_.get(), 0, me, &comm));
  return std::make_unique<Group>(std::move(name), Comm(comm), std::move(nodes), *types_);
}

std::unique_ptr<Group> Group::subgroup(std::string name, const std::vector<int>& members) const {
  std::vector<int> distinct = members;
  std::sort(distinct.begin(), distinct.end());
  if (std::adjacent_find(distinct.begin(), distinct.end()) != distinct.end() || distinct.empty() || distinct.front() < 0 ||
      distinct.back() >= size_)
    throw std::invalid_argument("subgroup of " + name_ + ": members must be distinct ranks of the group");
  const auto at = std::find(members.begin(), members.end(), rank_);
  const bool in = at != members.end();
  std::vector<int> nodes, world;
  for (int r : members) {
    nodes.push_back(node_of_rank_.at(static_cast<std::size_t>(r)));
    if (trace_) world.push_back(world_ranks_.at(static_cast<std::size_t>(r)));
  }
  const int me = static_cast<int>(at - members.begin());
  if (trace_) return in ? std::make_unique<Group>(std::move(name), std::move(world), me, std::move(nodes), *trace_) : nullptr;
  MPI_Comm comm = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_split(comm_.get(), in ? 0 : MPI_UNDEFINED, me, &comm));
  return in ? std::make_unique<Group>(std::move(name), Comm(comm), std::move(nodes), *types_) : nullptr;
}

Group::Group(std::string name, Comm comm, std::vector<int> node_of_rank, const MpiTypes& types)
    : name_(std::move(name)), comm_(std::move(comm)), node_of_rank_(std::move(node_of_rank)), types_(&types) {
  STRATA_MPI_CHECK(MPI_Comm_rank(comm_.get(), &rank_));
  STRATA_MPI_CHECK(MPI_Comm_size(comm_.get(), &size_));
  if (static_cast<int>(node_of_rank_.size()) != size_)
    throw std::invalid_argument("group " + name_ + ": node map of " + std::to_string(node_of_rank_.size()) +
                                " ranks for " + std::to_string(size_));
  std::map<int, int> per_node;
  for (int node : node_of_rank_) ++per_node[node];
  node_count_ = static_cast<int>(per_node.size());
  even_nodes_ = std::all_of(per_node.begin(), per_node.end(), [&](auto& kv) { return kv.second == per_node.begin()->second; });
  // Intra: my node's ranks in group order. Inter: the ranks with my local index, in node order.
  const int my_node = node_of_rank_[static_cast<std::size_t>(rank_)];
  int local = 0;
  for (int r = 0; r < rank_; ++r) local += node_of_rank_[static_cast<std::size_t>(r)] == my_node;
  MPI_Comm intra = MPI_COMM_NULL, inter = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_split(comm_.get(), my_node, rank_, &intra));
  intra_ = Comm(intra);
  STRATA_MPI_CHECK(MPI_Comm_split(comm_.get(), local, my_node, &inter));
  inter_ = Comm(inter);
  intra_nodes_.assign(static_cast<std::size_t>(per_node[my_node]), my_node);
  int inter_size = 0;
  STRATA_MPI_CHECK(MPI_Comm_size(inter_.get(), &inter_size));
  inter_nodes_.resize(static_cast<std::size_t>(inter_size));
  std::iota(inter_nodes_.begin(), inter_nodes_.end(), 1'000'000);  // all distinct: every message crosses nodes
  send_sequence_.assign(static_cast<std::size_t>(size_), 0);
  recv_sequence_.assign(static_cast<std::size_t>(size_), 0);
}

Group::~Group() = default;

ShmNode& Group::shm() {
  if (!shm_) shm_ = std::make_unique<ShmNode>(comm_.get(), shm_options);
  return *shm_;
}

std::optional<Group::IntraTurns> Group::take_intra_turns(Operation operation, std::size_t count) {
  const int per_node = static_cast<int>(intra_nodes_.size());
  if (!intra_shm || per_node < 2) return std::nullopt;
  if (operation == Operation::allreduce && count % static_cast<std::size_t>(per_node) != 0) return std::nullopt;
  if (intra_shm_state_ == IntraShm::unknown) {
    // Collective over the node's ranks, which reach it at the same operation (the conditions above are theirs too).
    MPI_Comm shared = MPI_COMM_NULL;
    STRATA_MPI_CHECK(MPI_Comm_split_type(intra_.get(), MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared));
    int shared_size = 0;
    const int rc = MPI_Comm_size(shared, &shared_size);
    MPI_Comm_free(&shared);
    STRATA_MPI_CHECK(rc);
    int all_share = shared_size == per_node ? 1 : 0;
    STRATA_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all_share, 1, MPI_INT, MPI_MIN, intra_.get()));
    intra_shm_state_ = all_share ? IntraShm::available : IntraShm::unavailable;
    if (all_share) {
      intra_first_ = std::make_unique<ShmNode>(intra_.get(), shm_options);
      intra_last_ = std::make_unique<ShmNode>(intra_.get(), shm_options);
    }
  }
  if (intra_shm_state_ != IntraShm::available) return std::nullopt;
  IntraTurns turns;
  if (operation != Operation::allgather) turns.first = intra_first_->reserve();
  if (operation != Operation::reduce_scatter) turns.last = intra_last_->reserve();
  return turns;
}

std::shared_ptr<std::byte> Group::take_scratch(std::size_t bytes) {
  bytes = std::max<std::size_t>(bytes, 1);
  std::vector<SpareScratch::Buffer>& spare = spare_scratch_->buffers;
  auto best = spare.end();  // the smallest spare that fits
  for (auto it = spare.begin(); it != spare.end(); ++it)
    if (it->bytes >= bytes && (best == spare.end() || it->bytes < best->bytes)) best = it;
  SpareScratch::Buffer buffer{bytes, nullptr};
  if (best != spare.end()) {
    buffer = std::move(*best);
    spare.erase(best);
  } else {
    buffer.data.reset(new std::byte[bytes]);  // uninitialised: every algorithm writes its scratch before reading it
  }
  const std::size_t size = buffer.bytes;
  return std::shared_ptr<std::byte>(buffer.data.release(), [spares = spare_scratch_, size](std::byte* memory) {
    std::unique_ptr<std::byte[]> owned(memory);
    std::vector<SpareScratch::Buffer>& kept = spares->buffers;
    if (kept.size() < SpareScratch::kKept) return kept.push_back({size, std::move(owned)});
    // Full: keep the larger ones, whose fresh allocation costs the most.
    auto smallest = std::min_element(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a.bytes < b.bytes; });
    if (smallest->bytes < size) *smallest = {size, std::move(owned)};
  });
}

bool Group::supports(Operation operation, Algo algo) { return info(operation).group_algos.has(algo); }

int Group::next_collective_tag() { return kCollectiveTagBase + static_cast<int>(collective_sequence_++ % kTagSpan); }

int Group::next_tag(std::vector<unsigned>& sequence, int peer) {
  return kPointToPointTagBase + static_cast<int>(sequence[static_cast<std::size_t>(peer)]++ % kTagSpan);
}

Work Group::allreduce_general(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                              RedOp op, Waiting waiting) {
  require(supports(Operation::allreduce, algo),
          [&] { return "allreduce has no non-blocking " + std::string(coll::name(algo)) + " algorithm"; });
  require((algo != Algo::hierarchical && algo != Algo::horing) || even_nodes_,
          [&] { return std::string(coll::name(algo)) + " allreduce needs the same number of ranks on every node"; });
  if (trace_) return trace_->collective(*this, Operation::allreduce, algo, count, dtype);
  const std::size_t bytes = count * size_of(dtype);
  auto* out = static_cast<std::byte*>(recvbuf);
  if (algo == Algo::shm) return shm().start(Operation::allreduce, sendbuf, recvbuf, count, dtype, op);
  const int tag = next_collective_tag();
  if (algo == Algo::library && waiting == Waiting::at_once) {
    STRATA_MPI_CHECK(MPI_Allreduce(sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf, recvbuf, static_cast<int>(count),
                                   types_->datatype(dtype), types_->op(dtype, op), comm_.get()));
    if (op == RedOp::avg) finish_avg(out, count, dtype, size_);
    return Work();
  }
  if (algo == Algo::library) {
    MPI_Request request;
    STRATA_MPI_CHECK(MPI_Iallreduce(sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf, recvbuf, static_cast<int>(count),
                                         types_->datatype(dtype), types_->op(dtype, op), comm_.get(), &request));
    return Work::start([&](Traffic*) {
      return library_then(request, op == RedOp::avg ? out : nullptr, count, dtype, size_, nullptr, nullptr, 0);
    });
  }
  if (sendbuf != recvbuf) std::memcpy(out, sendbuf, bytes);
  const int n = size_;
  if (algo == Algo::ring) {
    auto scratch = take_scratch((count / static_cast<std::size_t>(n) + 1) * size_of(dtype));
    return Work::start(
        [&](Traffic* traffic) {
          return [](Channel ch, std::byte* buf, std::size_t count, DataType dtype, RedOp op, std::byte* scratch,
                    int ranks) -> Step {
            co_await ring_allreduce(ch, buf, count, dtype, reduction_of(op), scratch);
            if (op == RedOp::avg) finish_avg(buf, count, dtype, ranks);
          }(Channel{comm_.get(), rank_, n, &node_of_rank_, traffic, tag,
                    max_message_bytes, ring_segment_bytes}, out, count, dtype, op, scratch.get(), n);
        },
        scratch);
  }
  if (algo == Algo::hierarchical)
    return hierarchical_allreduce(out, count, dtype, op, tag, take_intra_turns(Operation::allreduce, count));
  return horing(Operation::allreduce, count, size_of(dtype), intra_nodes_.size(),
                [this, out, dtype, op](std::size_t first, std::size_t piece, int chunk_tag, std::optional<IntraTurns> turns) {
                  return hierarchical_allreduce(out + first * size_of(dtype), piece, dtype, op, chunk_tag, std::move(turns));
                });
}

Work Group::reduce_scatter_general(Algo algo, const void* sendbuf, void* recvbuf, std::size_t recvcount,
                                   DataType dtype, RedOp op, Waiting waiting) {
  require(supports(Operation::reduce_scatter, algo),
          [&] { return "reduce_scatter has no non-blocking " + std::string(coll::name(algo)) + " algorithm"; });
  require((algo != Algo::hierarchical && algo != Algo::horing) || even_nodes_,
          [&] { return std::string(coll::name(algo)) + " reduce_scatter needs the same number of ranks on every node"; });
  if (trace_) return trace_->collective(*this, Operation::reduce_scatter, algo, recvcount, dtype);
  const std::size_t esize = size_of(dtype), block_bytes = recvcount * esize, total = block_bytes * static_cast<std::size_t>(size_);
  const auto* in = static_cast<const std::byte*>(sendbuf);
  auto* out = static_cast<std::byte*>(recvbuf);
  const bool in_place = out == in + static_cast<std::size_t>(rank_) * block_bytes;
  if (algo == Algo::shm) return shm().start(Operation::reduce_scatter, sendbuf, recvbuf, recvcount, dtype, op);
  const int tag = next_collective_tag();
  if (algo == Algo::library && waiting == Waiting::at_once) {
    // In place the input may be overwritten: MPI leaves the result at its start, NCCL's layout at my block.
    std::byte* in_place_input = const_cast<std::byte*>(in);
    STRATA_MPI_CHECK(MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : sendbuf, in_place ? in_place_input : out,
                                              static_cast<int>(recvcount), types_->datatype(dtype),
                                              types_->op(dtype, op), comm_.get()));
    if (in_place && rank_ != 0) std::memcpy(out, in_place_input, block_bytes);
    if (op == RedOp::avg) finish_avg(out, recvcount, dtype, size_);
    return Work();
  }
  if (algo == Algo::library) {
    // MPI's in-place reduce-scatter leaves the result at the start of the buffer, NCCL's at the rank's block: moved
    // there when it is done (no copy of the input, which may be a whole gradient).
    std::byte* in_place_input = const_cast<std::byte*>(in);
    const bool move = in_place && rank_ != 0;
    MPI_Request request;
    STRATA_MPI_CHECK(MPI_Ireduce_scatter_block(in_place ? MPI_IN_PLACE : sendbuf, in_place ? in_place_input : out,
                                               static_cast<int>(recvcount), types_->datatype(dtype),
                                               types_->op(dtype, op), comm_.get(), &request));
    return Work::start([&](Traffic*) {
      return library_then(request, op == RedOp::avg ? out : nullptr, recvcount, dtype, size_, move ? out : nullptr,
                          in_place_input, block_bytes);
    });
  }
  const int n = size_;
  if (algo == Algo::ring) {
    // In place, the input is the working buffer (it may be overwritten); otherwise a copy of it is.
    auto scratch = take_scratch(block_bytes + (in_place ? 0 : total));
    std::byte* work = in_place ? const_cast<std::byte*>(in) : scratch.get() + block_bytes;
    if (!in_place) std::memcpy(work, in, total);
    return Work::start(
        [&](Traffic* traffic) {
          return [](Channel ch, std::byte* work, std::byte* out, std::size_t recvcount, DataType dtype, RedOp op,
                    std::byte* scratch, bool in_place) -> Step {
            co_await ring_reduce_scatter(ch, work, equal_blocks(recvcount, ch.size), dtype, reduction_of(op), scratch);
            std::byte* mine = work + static_cast<std::size_t>(ch.rank) * recvcount * size_of(dtype);
            if (!in_place) std::memcpy(out, mine, recvcount * size_of(dtype));
            if (op == RedOp::avg) finish_avg(out, recvcount, dtype, ch.size);
          }(Channel{comm_.get(), rank_, n, &node_of_rank_, traffic, tag,
                    max_message_bytes, ring_segment_bytes}, work, out, recvcount, dtype, op,
                 scratch.get(), in_place);
        },
        scratch);
  }
  if (algo == Algo::hierarchical)
    return hierarchical_reduce_scatter(in, block_bytes, out, recvcount, dtype, op, tag,
                                       take_intra_turns(Operation::reduce_scatter, recvcount));
  return horing(Operation::reduce_scatter, recvcount, esize, 1,
                [this, in, out, block_bytes, dtype, op](std::size_t first, std::size_t piece, int chunk_tag,
                                                        std::optional<IntraTurns> turns) {
                  const std::size_t at = first * size_of(dtype);
                  return hierarchical_reduce_scatter(in + at, block_bytes, out + at, piece, dtype, op, chunk_tag,
                                                     std::move(turns));
                });
}

Work Group::allgather_general(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                              Waiting waiting) {
  require(supports(Operation::allgather, algo),
          [&] { return "allgather has no non-blocking " + std::string(coll::name(algo)) + " algorithm"; });
  require((algo != Algo::hierarchical && algo != Algo::horing) || even_nodes_,
          [&] { return std::string(coll::name(algo)) + " allgather needs the same number of ranks on every node"; });
  if (trace_) return trace_->collective(*this, Operation::allgather, algo, count, dtype);
  const std::size_t esize = size_of(dtype), block_bytes = count * esize;
  auto* out = static_cast<std::byte*>(recvbuf);
  const auto* in = static_cast<const std::byte*>(sendbuf);
  const bool in_place = in == out + static_cast<std::size_t>(rank_) * block_bytes;
  if (algo == Algo::shm) return shm().start(Operation::allgather, sendbuf, recvbuf, count, dtype);
  const int tag = next_collective_tag();
  if (algo == Algo::library && waiting == Waiting::at_once) {
    STRATA_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : sendbuf, static_cast<int>(count), types_->datatype(dtype),
                                   recvbuf, static_cast<int>(count), types_->datatype(dtype), comm_.get()));
    return Work();
  }
  if (algo == Algo::library) {
    MPI_Request request;
    STRATA_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : sendbuf, static_cast<int>(count), types_->datatype(dtype),
                                         recvbuf, static_cast<int>(count), types_->datatype(dtype), comm_.get(), &request));
    return Work::start([&](Traffic*) { return library_then(request, nullptr, 0, dtype, size_, nullptr, nullptr, 0); });
  }
  const int n = size_;
  if (algo == Algo::ring) {
    if (!in_place) std::memcpy(out + static_cast<std::size_t>(rank_) * block_bytes, in, block_bytes);
    return Work::start([&](Traffic* traffic) {
      return ring_allgather(Channel{comm_.get(), rank_, n, &node_of_rank_, traffic, tag,
                                    max_message_bytes, ring_segment_bytes}, out, equal_blocks(count, n), esize);
    });
  }
  if (algo == Algo::hierarchical)
    return hierarchical_allgather(in, out, block_bytes, count, dtype, tag, take_intra_turns(Operation::allgather, count));
  return horing(Operation::allgather, count, esize, 1,
                [this, in, out, block_bytes, dtype](std::size_t first, std::size_t piece, int chunk_tag,
                                                    std::optional<IntraTurns> turns) {
                  const std::size_t at = first * size_of(dtype);
                  return hierarchical_allgather(in + at, out + at, block_bytes, piece, dtype, chunk_tag, std::move(turns));
                });
}

Work Group::broadcast_general(Algo algo, void* buf, std::size_t count, DataType dtype, int root, Waiting waiting) {
  require(supports(Operation::broadcast, algo),
          [&] { return "broadcast has no non-blocking " + std::string(coll::name(algo)) + " algorithm"; });
  require(root >= 0 && root < size_,
          [&] { return "broadcast root " + std::to_string(root) + " is not a rank of group " + name_; });
  if (trace_) return trace_->collective(*this, Operation::broadcast, algo, count, dtype);
  if (algo == Algo::shm) return shm().start(Operation::broadcast, buf, buf, count, dtype, RedOp::sum, root);
  const int tag = next_collective_tag();
  if (algo == Algo::library && waiting == Waiting::at_once) {
    STRATA_MPI_CHECK(MPI_Bcast(buf, static_cast<int>(count), types_->datatype(dtype), root, comm_.get()));
    return Work();
  }
  if (algo == Algo::library) {
    MPI_Request request;
    STRATA_MPI_CHECK(MPI_Ibcast(buf, static_cast<int>(count), types_->datatype(dtype), root, comm_.get(), &request));
    return Work::start([&](Traffic*) { return library_then(request, nullptr, 0, dtype, size_, nullptr, nullptr, 0); });
  }
  return Work::start([&](Traffic* traffic) {
    return ring_broadcast(Channel{comm_.get(), rank_, size_, &node_of_rank_, traffic, tag,
                                  max_message_bytes, ring_segment_bytes}, static_cast<std::byte*>(buf),
                          count * size_of(dtype), root, std::size_t{256} << 10);
  });
}

Work Group::send(const void* buf, std::size_t count, DataType dtype, int peer) {
  require(peer >= 0 && peer < size_ && peer != rank_,
          [&] { return "send: peer " + std::to_string(peer) + " of group " + name_; });
  if (trace_) return trace_->point_to_point(*this, true, peer, count, dtype);
  const int tag = next_tag(send_sequence_, peer);
  return Work::start([&](Traffic* traffic) {
    return [](Channel ch, const std::byte* buf, std::size_t bytes, int peer) -> Step {
      Requests q;
      post_send(q, ch, buf, bytes, peer);
      co_await q;
    }(Channel{comm_.get(), rank_, size_, &node_of_rank_, traffic, tag,
              max_message_bytes, ring_segment_bytes}, static_cast<const std::byte*>(buf),
           count * size_of(dtype), peer);
  });
}

Work Group::recv(void* buf, std::size_t count, DataType dtype, int peer) {
  require(peer >= 0 && peer < size_ && peer != rank_,
          [&] { return "recv: peer " + std::to_string(peer) + " of group " + name_; });
  if (trace_) return trace_->point_to_point(*this, false, peer, count, dtype);
  const int tag = next_tag(recv_sequence_, peer);
  return Work::start([&](Traffic*) {
    return [](Channel ch, std::byte* buf, std::size_t bytes, int peer) -> Step {
      Requests q;
      post_recv(q, ch, buf, bytes, peer);
      co_await q;
    }(Channel{comm_.get(), rank_, size_, &node_of_rank_, nullptr, tag,
              max_message_bytes, ring_segment_bytes}, static_cast<std::byte*>(buf),
           count * size_of(dtype), peer);
  });
}

std::vector<std::string> parse_grid_order(const std::string& text) {
  std::vector<std::string> order;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    order.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::vector<std::string> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  if (sorted != std::vector<std::string>{"dp", "pp", "tp"})
    throw std::invalid_argument("grid order '" + text + "': expected tp, pp and dp once each, e.g. tp,pp,dp");
  return order;
}

std::array<int, 3> grid_strides(const GridShape& grid, const std::vector<std::string>& order) {
  const std::array<int, 3> sizes{grid.tp, grid.pp, grid.dp};
  std::array<int, 3> stride{1, 1, 1};
  int next = 1;
  for (const std::string& name : order) {
    const std::size_t d = name == "tp" ? 0 : name == "pp" ? 1 : 2;
    stride[d] = next;
    next *= sizes[d];
  }
  return stride;
}

namespace {

// Where every world rank sits in the grid, without MPI: both constructors build the groups from this, so a
// traced job has the same groups as a running one.
struct GridPlaces {
  std::array<int, 3> sizes{}, stride{1, 1, 1};

  GridPlaces(const GridShape& grid, const std::vector<std::string>& order)
      : sizes{grid.tp, grid.pp, grid.dp}, stride(grid_strides(grid, order)) {}
  int index(int rank, std::size_t d) const { return rank / stride[d] % sizes[d]; }
  // The world ranks that differ from `rank` in coordinate d only, in that coordinate's order.
  std::vector<int> dimension(int rank, std::size_t d) const {
    std::vector<int> members;
    const int base = rank - index(rank, d) * stride[d];
    for (int k = 0; k < sizes[d]; ++k) members.push_back(base + k * stride[d]);
    return members;
  }
};

// Inside a data-parallel group (members in dp order, their nodes): my position among my node's members, and the
// members on my node (intra) and those with my position on theirs (inter), in dp order.
struct DataParallelSplit {
  int local = 0;
  std::vector<int> intra, inter;  // dp ranks
  DataParallelSplit(const std::vector<int>& dp_nodes, int dp_rank) {
    const int my_node = dp_nodes[static_cast<std::size_t>(dp_rank)];
    for (int r = 0; r < dp_rank; ++r) local += dp_nodes[static_cast<std::size_t>(r)] == my_node;
    std::map<int, int> seen;  // node -> DP ranks counted so far
    for (int r = 0; r < static_cast<int>(dp_nodes.size()); ++r) {
      const int node = dp_nodes[static_cast<std::size_t>(r)];
      const int index = seen[node]++;
      if (node == my_node) intra.push_back(r);
      if (index == local) inter.push_back(r);
    }
  }
};

}  // namespace

ProcessGroups::ProcessGroups(const GridShape& grid, int ranks_per_node, const std::string& order)
    : grid_(grid), order_(parse_grid_order(order)), types_(std::make_unique<MpiTypes>()) {
  const Layout layout(ranks_per_node);
  const int world_size = layout.world_size(), me = layout.world_rank();
  if (grid.size() != world_size)
    throw std::invalid_argument("grid " + format_grid(grid) + " has " + std::to_string(grid.size()) + " ranks, the job " +
                                std::to_string(world_size));
  const GridPlaces places(grid, order_);
  for (std::size_t d = 0; d < 3; ++d) stride_[d] = places.stride[d], index_[d] = places.index(me, d);
  const std::vector<int>& world_nodes = layout.node_of_rank();

  MPI_Comm dup = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup));
  world_ = std::make_unique<Group>("world", Comm(dup), world_nodes, *types_);
  auto dimension_group = [&](std::size_t d, const char* name) {
    const std::vector<int> members = places.dimension(me, d);
    std::vector<int> nodes;
    for (int r : members) nodes.push_back(world_nodes[static_cast<std::size_t>(r)]);
    MPI_Comm comm = MPI_COMM_NULL;
    STRATA_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, members.front(), index_[d], &comm));
    return std::make_unique<Group>(name, Comm(comm), std::move(nodes), *types_);
  };
  tp_ = dimension_group(0, "tp");
  pp_ = dimension_group(1, "pp");
  dp_ = dimension_group(2, "dp");

  // Inside data parallelism: the DP ranks on my node, and those with my index among their node's DP ranks.
  const std::vector<int>& dp_nodes = dp_->node_of_rank();
  const DataParallelSplit split(dp_nodes, dp_->rank());
  auto nodes_of = [&](const std::vector<int>& dp_ranks) {
    std::vector<int> nodes;
    for (int r : dp_ranks) nodes.push_back(dp_nodes[static_cast<std::size_t>(r)]);
    return nodes;
  };
  MPI_Comm intra = MPI_COMM_NULL, inter = MPI_COMM_NULL;
  STRATA_MPI_CHECK(MPI_Comm_split(dp_->comm(), dp_nodes[static_cast<std::size_t>(dp_->rank())], dp_->rank(), &intra));
  dp_intra_ = std::make_unique<Group>("dp_intra", Comm(intra), nodes_of(split.intra), *types_);
  STRATA_MPI_CHECK(MPI_Comm_split(dp_->comm(), split.local, dp_->rank(), &inter));
  dp_inter_ = std::make_unique<Group>("dp_inter", Comm(inter), nodes_of(split.inter), *types_);
}

ProcessGroups::ProcessGroups(const GridShape& grid, int ranks_per_node, const std::string& order, int rank, GroupTrace& trace)
    : grid_(grid), order_(parse_grid_order(order)) {
  const long long world_size = grid.size();
  if (ranks_per_node < 1 || world_size % ranks_per_node != 0)
    throw std::invalid_argument("a traced grid needs ranks per node that divide its " + std::to_string(world_size) + " ranks");
  if (rank < 0 || rank >= world_size)
    throw std::invalid_argument("rank " + std::to_string(rank) + " of a grid of " + std::to_string(world_size));
  const GridPlaces places(grid, order_);
  for (std::size_t d = 0; d < 3; ++d) stride_[d] = places.stride[d], index_[d] = places.index(rank, d);
  auto group = [&](const char* name, std::vector<int> members) {
    std::vector<int> nodes;
    for (int r : members) nodes.push_back(r / ranks_per_node);
    const int me = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    return std::make_unique<Group>(name, std::move(members), me, std::move(nodes), trace);
  };
  std::vector<int> everyone(static_cast<std::size_t>(world_size));
  std::iota(everyone.begin(), everyone.end(), 0);
  world_ = group("world", everyone);
  tp_ = group("tp", places.dimension(rank, 0));
  pp_ = group("pp", places.dimension(rank, 1));
  const std::vector<int> dp_members = places.dimension(rank, 2);
  dp_ = group("dp", dp_members);
  const DataParallelSplit split(dp_->node_of_rank(), dp_->rank());
  auto world_of = [&](const std::vector<int>& dp_ranks) {
    std::vector<int> members;
    for (int r : dp_ranks) members.push_back(dp_members[static_cast<std::size_t>(r)]);
    return members;
  };
  dp_intra_ = group("dp_intra", world_of(split.intra));
  dp_inter_ = group("dp_inter", world_of(split.inter));
}

int ProcessGroups::world_rank_of(int tp, int pp, int dp) const {
  return tp * stride_[0] + pp * stride_[1] + dp * stride_[2];
}

// Hierarchical: reduce-scatter in the node, allreduce of my shard across nodes, allgather in the node; in place
// on buf. Through shared memory (`turns`), the count divides among the node's ranks, so the shards are equal.
Work Group::hierarchical_allreduce(std::byte* out, std::size_t count, DataType dtype, RedOp op, int tag,
                                   std::optional<IntraTurns> turns) {
  const int n = size_;
  const int per_node = static_cast<int>(intra_nodes_.size());
  int local = 0, node_position = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(intra_.get(), &local));
  STRATA_MPI_CHECK(MPI_Comm_rank(inter_.get(), &node_position));
  auto scratch = take_scratch((count / static_cast<std::size_t>(per_node) + 1) * size_of(dtype));
  return Work::start(
      [&](Traffic* traffic) {
        return [](Channel intra, Channel inter, std::byte* buf, std::size_t count, DataType dtype, RedOp op,
                  std::byte* scratch, int ranks, std::optional<IntraTurns> turns, ShmNode* first,
                  ShmNode* last) -> Step {
          const Blocks shards = even_blocks(count, intra.size);
          const RedOp reduce = reduction_of(op);
          const std::size_t esize = size_of(dtype);
          std::byte* mine = buf + shards.start(intra.rank) * esize;
          const std::size_t shard = shards.length(intra.rank);
          if (turns)
            co_await phase(first->start(std::move(*turns->first), Operation::reduce_scatter, buf, mine, shard, dtype, reduce),
                           intra.traffic);
          else
            co_await ring_reduce_scatter(intra, buf, shards, dtype, reduce, scratch);
          co_await ring_allreduce(inter, mine, shard, dtype, reduce, scratch);
          if (turns)
            co_await phase(last->start(std::move(*turns->last), Operation::allgather, mine, buf, shard, dtype), intra.traffic);
          else
            co_await ring_allgather(intra, buf, shards, esize);
          if (op == RedOp::avg) finish_avg(buf, count, dtype, ranks);
        }(Channel{intra_.get(), local, per_node, &intra_nodes_, traffic, tag, max_message_bytes, ring_segment_bytes},
               Channel{inter_.get(), node_position, static_cast<int>(inter_nodes_.size()), &inter_nodes_, traffic, tag,
                       max_message_bytes, ring_segment_bytes},
               out, count, dtype, op, scratch.get(), n, std::move(turns), intra_first_.get(), intra_last_.get());
      },
      scratch);
}

// Hierarchical: the input's blocks are rearranged by (local index, node), so that an intra reduce-scatter of L
// super-blocks leaves local rank l with the blocks of every rank of local index l, which an inter reduce-scatter
// over the nodes then finishes.
Work Group::hierarchical_reduce_scatter(const std::byte* in, std::size_t in_stride, std::byte* out, std::size_t recvcount,
                                        DataType dtype, RedOp op, int tag, std::optional<IntraTurns> turns) {
  const int n = size_;
  const std::size_t block_bytes = recvcount * size_of(dtype), total = block_bytes * static_cast<std::size_t>(n);
  const int per_node = static_cast<int>(intra_nodes_.size()), nodes = n / per_node;
  int local = 0, node_position = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(intra_.get(), &local));
  STRATA_MPI_CHECK(MPI_Comm_rank(inter_.get(), &node_position));
  std::vector<int> rank_at = group_ranks_by_node_and_local(node_of_rank_);
  auto scratch = take_scratch(total + block_bytes * static_cast<std::size_t>(nodes));
  std::byte* work = scratch.get();
  for (int l = 0; l < per_node; ++l)
    for (int m = 0; m < nodes; ++m)
      std::memcpy(work + (static_cast<std::size_t>(l) * nodes + m) * block_bytes,
                  in + static_cast<std::size_t>(rank_at[static_cast<std::size_t>(m * per_node + l)]) * in_stride, block_bytes);
  return Work::start(
      [&](Traffic* traffic) {
        return [](Channel intra, Channel inter, std::byte* work, std::byte* out, std::size_t recvcount, DataType dtype,
                  RedOp op, std::byte* scratch, int ranks, std::optional<IntraTurns> turns, ShmNode* first) -> Step {
          const std::size_t block_bytes = recvcount * size_of(dtype);
          const std::size_t super_count = recvcount * static_cast<std::size_t>(inter.size);
          const RedOp reduce = reduction_of(op);
          std::byte* super = work + static_cast<std::size_t>(intra.rank) * inter.size * block_bytes;
          if (turns)
            co_await phase(first->start(std::move(*turns->first), Operation::reduce_scatter, work, super, super_count,
                                        dtype, reduce),
                           intra.traffic);
          else
            co_await ring_reduce_scatter(intra, work, equal_blocks(super_count, intra.size), dtype, reduce, scratch);
          co_await ring_reduce_scatter(inter, super, equal_blocks(recvcount, inter.size), dtype, reduce, scratch);
          std::memcpy(out, super + static_cast<std::size_t>(inter.rank) * block_bytes, block_bytes);
          if (op == RedOp::avg) finish_avg(out, recvcount, dtype, ranks);
        }(Channel{intra_.get(), local, per_node, &intra_nodes_, traffic, tag, max_message_bytes, ring_segment_bytes},
               Channel{inter_.get(), node_position, nodes, &inter_nodes_, traffic, tag,
                       max_message_bytes, ring_segment_bytes}, work, out, recvcount, dtype, op,
               work + total, n, std::move(turns), intra_first_.get());
      },
      scratch);
}

// Hierarchical: across nodes among ranks of my local index, then inside the node, in (local, node) order; then
// back to group-rank order.
Work Group::hierarchical_allgather(const std::byte* in, std::byte* out, std::size_t out_stride, std::size_t count,
                                   DataType dtype, int tag, std::optional<IntraTurns> turns) {
  const int n = size_;
  const std::size_t esize = size_of(dtype), block_bytes = count * esize;
  const int per_node = static_cast<int>(intra_nodes_.size()), nodes = n / per_node;
  int local = 0, node_position = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(intra_.get(), &local));
  STRATA_MPI_CHECK(MPI_Comm_rank(inter_.get(), &node_position));
  std::vector<int> rank_at = group_ranks_by_node_and_local(node_of_rank_);
  auto scratch = take_scratch(block_bytes * static_cast<std::size_t>(n));
  std::byte* work = scratch.get();
  std::memcpy(work + (static_cast<std::size_t>(local) * nodes + node_position) * block_bytes, in, block_bytes);
  return Work::start(
      [&](Traffic* traffic) {
        return [](Channel intra, Channel inter, std::byte* work, std::byte* out, std::size_t out_stride, std::size_t count,
                  DataType dtype, std::vector<int> rank_at, std::optional<IntraTurns> turns, ShmNode* last) -> Step {
          const std::size_t esize = size_of(dtype), block_bytes = count * esize;
          const int nodes = inter.size, per_node = intra.size;
          std::byte* super = work + static_cast<std::size_t>(intra.rank) * nodes * block_bytes;
          co_await ring_allgather(inter, super, equal_blocks(count, nodes), esize);
          const std::size_t super_count = count * static_cast<std::size_t>(nodes);
          if (turns)
            co_await phase(last->start(std::move(*turns->last), Operation::allgather, super, work, super_count, dtype),
                           intra.traffic);
          else
            co_await ring_allgather(intra, work, equal_blocks(super_count, per_node), esize);
          for (int l = 0; l < per_node; ++l)
            for (int m = 0; m < nodes; ++m)
              std::memcpy(out + static_cast<std::size_t>(rank_at[static_cast<std::size_t>(m * per_node + l)]) * out_stride,
                          work + (static_cast<std::size_t>(l) * nodes + m) * block_bytes, block_bytes);
        }(Channel{intra_.get(), local, per_node, &intra_nodes_, traffic, tag, max_message_bytes, ring_segment_bytes},
               Channel{inter_.get(), node_position, nodes, &inter_nodes_, traffic, tag,
                       max_message_bytes, ring_segment_bytes}, work, out, out_stride, count,
               dtype, std::move(rank_at), std::move(turns), intra_last_.get());
      },
      scratch);
}

// HO-Ring: the chunks' hierarchical operations, started in order with tags and shared-memory turns taken now
// (every rank takes them in the same order, whenever a chunk starts), at most kHoRingWindow in flight,
// progressed together.
Work Group::horing(Operation operation, std::size_t elements, std::size_t esize, std::size_t granule,
                   const ChunkStart& start) {
  require(even_nodes_, [] { return "horing needs the same number of ranks on every node"; });
  std::size_t per_chunk = std::max({std::size_t{1}, horing_chunk_bytes / esize, (elements + kHoRingChunks - 1) / kHoRingChunks});
  per_chunk = (per_chunk + granule - 1) / granule * granule;  // whole shards for every chunk's intra phases
  const std::size_t chunks = std::max<std::size_t>(1, (elements + per_chunk - 1) / per_chunk);
  std::vector<int> tags(chunks);
  auto turns = std::make_shared<std::vector<std::optional<IntraTurns>>>(chunks);
  for (std::size_t c = 0; c < chunks; ++c) {
    tags[c] = next_collective_tag();
    (*turns)[c] = take_intra_turns(operation, std::min(per_chunk, elements - std::min(elements, c * per_chunk)));
  }
  auto start_chunk = [start, tags, turns, elements, per_chunk](std::size_t c) {
    const std::size_t first = c * per_chunk;
    return start(first, std::min(per_chunk, elements - first), tags[c], std::move((*turns)[c]));
  };
  return Work::start([&](Traffic* traffic) {
    return [](std::function<Work(std::size_t)> start_chunk, std::size_t chunks, Traffic* traffic) -> Step {
      std::deque<Work> in_flight;
      std::size_t next = 0;
      while (next < chunks || !in_flight.empty()) {
        while (next < chunks && in_flight.size() < static_cast<std::size_t>(kHoRingWindow)) in_flight.push_back(start_chunk(next++));
        for (Work& w : in_flight) w.test();
        const std::size_t before = in_flight.size();
        while (!in_flight.empty() && in_flight.front().done()) {
          *traffic += in_flight.front().traffic();
          in_flight.pop_front();
        }
        if (in_flight.size() == before) co_await Yield{};
      }
    }(start_chunk, chunks, traffic);
  });
}

}  // namespace strata::coll
