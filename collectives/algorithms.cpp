// Collective algorithms over MPI point-to-point messages, and the MPI library path with the same signatures.
// Every own algorithm works in place on a byte buffer cut into blocks; the ring algorithms share one ring
// pass, the recursive ones one "fold" for rank counts that are not a power of two, and the hierarchical
// ones compose ring passes on the intra-node and inter-node communicators.
#include "collectives/algorithms.h"

#include <stdexcept>
#include <algorithm>
#include <bit>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <numeric>
#include <string>

#include "collectives/mpi_error.h"
#include "collectives/layout.h"

namespace strata::coll {

namespace {


// One tag per operation, so a stray message of one collective can never match a receive of another.
enum Tag : int {
  kTagAllreduce = 7101,
  kTagAllgather,
  kTagReduceScatter,
  kTagAlltoall,
  kTagBroadcast,
  kTagReduce,
  kTagSendrecv,
};

int wrap(int index, int n) { return ((index % n) + n) % n; }

// Scratch memory kept across calls: a timed collective must not allocate (and page-fault) fresh buffers on
// every call. Slot 0 receives inside one pass; slot 1 stages data around passes (hierarchical steps).
std::byte* scratch(int slot, std::size_t bytes) {
  thread_local std::vector<std::byte> buffers[2];
  std::vector<std::byte>& buffer = buffers[slot];
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

// Tolerates identical ranges (in-place calls) and empty ones (data() of an empty vector may be null).
void copy_bytes(void* dst, const void* src, std::size_t bytes) {
  if (bytes != 0 && dst != src) std::memmove(dst, src, bytes);
}

int comm_rank(MPI_Comm comm) {
  int rank = 0;
  STRATA_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  return rank;
}

int comm_size(MPI_Comm comm) {
  int size = 0;
  STRATA_MPI_CHECK(MPI_Comm_size(comm, &size));
  return size;
}

// Point-to-point messages on one communicator, counting every byte sent as intra- or inter-node.
class Link {
 public:
  Link(MPI_Comm comm, std::vector<int> node_of_rank, Traffic& traffic, const Context& ctx)
      : max_message_(std::max<std::size_t>(1, std::min(ctx.max_message_bytes, std::size_t{INT_MAX}))),
        ring_segment_(std::max<std::size_t>(1, ctx.ring_segment_bytes)),
        comm_(comm),
        rank_(comm_rank(comm)),
        size_(comm_size(comm)),
        node_of_rank_(std::move(node_of_rank)),
        traffic_(traffic) {}

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::size_t ring_segment() const { return ring_segment_; }

  void post_send(const std::byte* buf, std::size_t bytes, int dest, int tag) {
    for (std::size_t offset = 0; offset < bytes; offset += max_message_) {
      const int piece = static_cast<int>(std::min(max_message_, bytes - offset));
      STRATA_MPI_CHECK(MPI_Isend(buf + offset, piece, MPI_BYTE, dest, tag, comm_, &pending_.emplace_back()));
    }
    (node_of_rank_[static_cast<std::size_t>(dest)] == node_of_rank_[static_cast<std::size_t>(rank_)]
         ? traffic_.intra_bytes
         : traffic_.inter_bytes) += bytes;
  }

  void post_recv(std::byte* buf, std::size_t bytes, int src, int tag) {
    post_recv_into(pending_, buf, bytes, src, tag);
  }

  void wait_all() {
    STRATA_MPI_CHECK(MPI_Waitall(static_cast<int>(pending_.size()), pending_.data(), MPI_STATUSES_IGNORE));
    pending_.clear();
  }

  void send_now(const std::byte* buf, std::size_t bytes, int dest, int tag) {
    post_send(buf, bytes, dest, tag);
    wait_all();
  }

  // Waits for this receive only, leaving earlier sends in flight (pipelined chains).
  void recv_now(std::byte* buf, std::size_t bytes, int src, int tag) {
    std::vector<MPI_Request> requests;
    post_recv_into(requests, buf, bytes, src, tag);
    STRATA_MPI_CHECK(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
  }

  // One piece's receive with its own requests (several when the piece is longer than a message), for
  // callers that wait piece by piece.
  void post_recv_piece(std::byte* buf, std::size_t bytes, int src, int tag, std::vector<MPI_Request>& requests) {
    post_recv_into(requests, buf, bytes, src, tag);
  }

  void exchange(const std::byte* send, std::size_t send_bytes, int dest, std::byte* recv, std::size_t recv_bytes,
                int src, int tag) {
    post_recv(recv, recv_bytes, src, tag);
    post_send(send, send_bytes, dest, tag);
    wait_all();
  }

 private:
  void post_recv_into(std::vector<MPI_Request>& requests, std::byte* buf, std::size_t bytes, int src, int tag) {
    for (std::size_t offset = 0; offset < bytes; offset += max_message_) {
      const int piece = static_cast<int>(std::min(max_message_, bytes - offset));
      STRATA_MPI_CHECK(MPI_Irecv(buf + offset, piece, MPI_BYTE, src, tag, comm_, &requests.emplace_back()));
    }
  }

  std::size_t max_message_;
  std::size_t ring_segment_;
  MPI_Comm comm_;
  int rank_;
  int size_;
  std::vector<int> node_of_rank_;
  Traffic& traffic_;
  std::vector<MPI_Request> pending_;
};

struct Reduction {
  DataType dtype;
  RedOp op;  // avg reduces as sum; the caller divides at the end
  void apply(std::byte* dst, const std::byte* src, std::size_t bytes) const {
    reduce_into(dst, src, bytes / size_of(dtype), dtype, op);
  }
};

// Byte offsets of the blocks a buffer is cut into: block b is [blocks[b], blocks[b + 1]).
using Blocks = std::vector<std::size_t>;

// count elements in parts blocks whose sizes differ by at most one element.
Blocks even_blocks(std::size_t count, int parts, std::size_t elem_size) {
  Blocks blocks;
  const auto n = static_cast<std::size_t>(parts);
  for (std::size_t b = 0; b <= n; ++b) blocks.push_back((b * (count / n) + std::min(b, count % n)) * elem_size);
  return blocks;
}

Blocks equal_blocks(std::size_t block_bytes, int parts) {
  Blocks blocks;
  for (std::size_t b = 0; b <= static_cast<std::size_t>(parts); ++b) blocks.push_back(b * block_bytes);
  return blocks;
}

std::size_t block_size(const Blocks& blocks, int b) {
  return blocks[static_cast<std::size_t>(b) + 1] - blocks[static_cast<std::size_t>(b)];
}

// ---- ring ---------------------------------------------------------------------------------------------

// One trip around the ring in size - 1 steps: at step s this rank sends block (rank + shift - s) to the
// right and receives block (rank + shift - s - 1) from the left. With a reduction the received block is
// combined into the local one, so with shift -1 rank r ends holding the full reduction of block r
// (reduce-scatter); without, it is stored as is, so with shift 0 and block r filled every rank ends with
// every block (allgather). With `input` (out of place), the reduction reads this rank's contribution from
// there, so buf needs no copy of the input first: the first step sends from input, and each received
// segment is combined with input's segment into buf.
void ring_pass(Link& link, std::byte* buf, const Blocks& blocks, int shift, const Reduction* reduction, int tag,
               const std::byte* input = nullptr) {
  const int n = link.size();
  const int right = wrap(link.rank() + 1, n);
  const int left = wrap(link.rank() - 1, n);
  // With a reduction, blocks travel in segments: each received segment is reduced while the next one
  // arrives, into one of two scratch slots small enough to stay in cache.
  const std::size_t elem = reduction != nullptr ? size_of(reduction->dtype) : 1;
  // A segment is whole elements, at least one (sent as several messages when one element is longer than a
  // message).
  const std::size_t segment = std::max(elem, link.ring_segment() / elem * elem);
  std::byte* incoming = reduction != nullptr ? scratch(0, 2 * segment) : nullptr;
  std::vector<MPI_Request> requests[2];  // each receive slot's messages
  for (int step = 0; step < n - 1; ++step) {
    const int send_block = wrap(link.rank() + shift - step, n);
    const int recv_block = wrap(link.rank() + shift - step - 1, n);
    const std::byte* send_at = (step == 0 && input ? input : buf) + blocks[static_cast<std::size_t>(send_block)];
    const std::byte* own = input ? input + blocks[static_cast<std::size_t>(recv_block)] : nullptr;
    std::byte* recv_at = buf + blocks[static_cast<std::size_t>(recv_block)];
    const std::size_t send_bytes = block_size(blocks, send_block), recv_bytes = block_size(blocks, recv_block);
    if (reduction == nullptr) {
      link.exchange(send_at, send_bytes, right, recv_at, recv_bytes, left, tag);
      continue;
    }
    for (std::size_t offset = 0; offset < send_bytes; offset += segment)
      link.post_send(send_at + offset, std::min(segment, send_bytes - offset), right, tag);
    const std::size_t pieces = (recv_bytes + segment - 1) / segment;
    auto piece_bytes = [&](std::size_t k) { return std::min(segment, recv_bytes - k * segment); };
    for (std::size_t k = 0; k < std::min<std::size_t>(2, pieces); ++k)
      link.post_recv_piece(incoming + k * segment, piece_bytes(k), left, tag, requests[k]);
    for (std::size_t k = 0; k < pieces; ++k) {
      std::vector<MPI_Request>& slot = requests[k % 2];
      STRATA_MPI_CHECK(MPI_Waitall(static_cast<int>(slot.size()), slot.data(), MPI_STATUSES_IGNORE));
      slot.clear();
      if (own) copy_bytes(recv_at + k * segment, own + k * segment, piece_bytes(k));
      reduction->apply(recv_at + k * segment, incoming + (k % 2) * segment, piece_bytes(k));
      if (k + 2 < pieces)
        link.post_recv_piece(incoming + (k % 2) * segment, piece_bytes(k + 2), left, tag, slot);
    }
    link.wait_all();
  }
}

void ring_reduce_scatter(Link& link, std::byte* buf, const Blocks& blocks, const Reduction& reduction, int tag,
                         const std::byte* input = nullptr) {
  ring_pass(link, buf, blocks, -1, &reduction, tag, input);
}

void ring_allgather(Link& link, std::byte* buf, const Blocks& blocks, int tag) {
  ring_pass(link, buf, blocks, 0, nullptr, tag);
}

void ring_allreduce(Link& link, std::byte* buf, std::size_t bytes, const Reduction& reduction, int tag,
                    const std::byte* input = nullptr) {
  const std::size_t elem_size = size_of(reduction.dtype);
  const Blocks blocks = even_blocks(bytes / elem_size, link.size(), elem_size);
  ring_reduce_scatter(link, buf, blocks, reduction, tag, input);
  ring_allgather(link, buf, blocks, tag);
}

// ---- recursive doubling / halving -----------------------------------------------------------------------

// Recursive doubling needs a power-of-two rank count. With n = 2^k + extra ranks, the first 2 * extra ranks
// pair up: each even one hands its data to the odd one after it and sits out until the end. The 2^k ranks
// left ("survivors") each stand for a run of consecutive ranks, so their data stays contiguous in rank order.
struct Fold {
  int survivors;
  int extra;

  explicit Fold(int rank_count)
      : survivors(static_cast<int>(std::bit_floor(static_cast<unsigned>(rank_count)))),
        extra(rank_count - survivors) {}

  bool sits_out(int rank) const { return rank < 2 * extra && rank % 2 == 0; }
  bool has_partner(int rank) const { return rank < 2 * extra; }  // the extra pair, seen from either side
  int survivor_index(int rank) const { return rank < 2 * extra ? rank / 2 : rank - extra; }
  int survivor_rank(int index) const { return index < extra ? 2 * index + 1 : index + extra; }
  // Survivor i stands for ranks [first_rank(i), first_rank(i + 1)).
  int first_rank(int index) const { return index < extra ? 2 * index : index + extra; }
};

void recursive_doubling_allreduce(Link& link, std::byte* buf, std::size_t bytes, const Reduction& reduction,
                                  int tag) {
  const Fold fold(link.size());
  const int rank = link.rank();
  std::byte* incoming = scratch(0, bytes);
  if (fold.sits_out(rank)) {
    link.send_now(buf, bytes, rank + 1, tag);
    link.recv_now(buf, bytes, rank + 1, tag);
    return;
  }
  if (fold.has_partner(rank)) {
    link.recv_now(incoming, bytes, rank - 1, tag);
    reduction.apply(buf, incoming, bytes);
  }
  // Partners combine the same two values in opposite order; every op is commutative bit for bit (IEEE
  // addition and multiplication included), so all ranks end with identical bits.
  const int me = fold.survivor_index(rank);
  for (int mask = 1; mask < fold.survivors; mask <<= 1) {
    const int partner = fold.survivor_rank(me ^ mask);
    link.exchange(buf, bytes, partner, incoming, bytes, partner, tag);
    reduction.apply(buf, incoming, bytes);
  }
  if (fold.has_partner(rank)) {
    link.send_now(buf, bytes, rank - 1, tag);
  }
}

// Bytes of the blocks of the ranks that survivors [first, first + count) stand for.
struct Span {
  std::size_t offset;
  std::size_t bytes;
};
Span survivor_span(const Fold& fold, const Blocks& blocks, int first, int count) {
  const std::size_t begin = blocks[static_cast<std::size_t>(fold.first_rank(first))];
  const std::size_t end = blocks[static_cast<std::size_t>(fold.first_rank(first + count))];
  return {begin, end - begin};
}

// Block r of buf holds rank r's data on entry; every block is filled on exit.
void recursive_doubling_allgather(Link& link, std::byte* buf, const Blocks& blocks, int tag) {
  const Fold fold(link.size());
  const int rank = link.rank();
  const std::size_t total = blocks.back();
  if (fold.sits_out(rank)) {
    link.send_now(buf + blocks[static_cast<std::size_t>(rank)], block_size(blocks, rank), rank + 1, tag);
    link.recv_now(buf, total, rank + 1, tag);
    return;
  }
  if (fold.has_partner(rank))
    link.recv_now(buf + blocks[static_cast<std::size_t>(rank - 1)], block_size(blocks, rank - 1), rank - 1, tag);
  const int me = fold.survivor_index(rank);
  for (int mask = 1; mask < fold.survivors; mask <<= 1) {
    const int partner = me ^ mask;
    const Span mine = survivor_span(fold, blocks, me & ~(mask - 1), mask);
    const Span theirs = survivor_span(fold, blocks, partner & ~(mask - 1), mask);
    link.exchange(buf + mine.offset, mine.bytes, fold.survivor_rank(partner), buf + theirs.offset, theirs.bytes,
                  fold.survivor_rank(partner), tag);
  }
  if (fold.has_partner(rank)) {
    link.send_now(buf, total, rank - 1, tag);
  }
}

// Recursive halving: each step splits the range of blocks still being reduced, sends the partner the half
// it goes on with and reduces the other half with what the partner sends back, so rank r ends holding the
// full reduction of block r.
void recursive_halving_reduce_scatter(Link& link, std::byte* buf, const Blocks& blocks, const Reduction& reduction,
                                      int tag) {
  const Fold fold(link.size());
  const int rank = link.rank();
  const std::size_t total = blocks.back();
  std::byte* incoming = scratch(0, total);
  if (fold.sits_out(rank)) {
    link.send_now(buf, total, rank + 1, tag);
    link.recv_now(buf + blocks[static_cast<std::size_t>(rank)], block_size(blocks, rank), rank + 1, tag);
    return;
  }
  if (fold.has_partner(rank)) {
    link.recv_now(incoming, total, rank - 1, tag);
    reduction.apply(buf, incoming, total);
  }
  const int me = fold.survivor_index(rank);
  int first = 0;  // the survivors whose blocks this rank still reduces: [first, first + 2 * mask)
  for (int mask = fold.survivors / 2; mask >= 1; mask >>= 1) {
    const int partner = me ^ mask;
    const int kept_first = (me & mask) != 0 ? first + mask : first;
    const int given_first = (me & mask) != 0 ? first : first + mask;
    const Span kept = survivor_span(fold, blocks, kept_first, mask);
    const Span given = survivor_span(fold, blocks, given_first, mask);
    link.exchange(buf + given.offset, given.bytes, fold.survivor_rank(partner), incoming, kept.bytes,
                  fold.survivor_rank(partner), tag);
    reduction.apply(buf + kept.offset, incoming, kept.bytes);
    first = kept_first;
  }
  if (fold.has_partner(rank)) {
    link.send_now(buf + blocks[static_cast<std::size_t>(rank - 1)], block_size(blocks, rank - 1), rank - 1, tag);
  }
}

std::vector<int> node_map(const Context& ctx, int n) {
  return ctx.node_of_rank.empty() ? std::vector<int>(static_cast<std::size_t>(n), 0) : ctx.node_of_rank;
}

// ---- hierarchical ---------------------------------------------------------------------------------------

// The ranks of the communicator as a nodes x local-index table, read from the node map and checked against
// the intra and inter communicators the caller gave.
struct NodeTable {
  int nodes = 0;
  int per_node = 0;
  int my_node = 0;   // position of my node, = my rank in inter
  int my_local = 0;  // my position on my node, = my rank in intra
  std::vector<int> rank_at;  // [node * per_node + local] -> comm rank

  int rank_of(int node, int local) const { return rank_at[static_cast<std::size_t>(node * per_node + local)]; }
};

NodeTable node_table(const Context& ctx, int rank, int n) {
  if (ctx.intra == MPI_COMM_NULL || ctx.inter == MPI_COMM_NULL)
    throw std::invalid_argument("hierarchical algorithms need the intra-node and inter-node communicators");
  const std::vector<int> node_ids = node_map(ctx, n);
  std::vector<int> distinct = node_ids;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  NodeTable table;
  table.nodes = static_cast<int>(distinct.size());
  std::vector<std::vector<int>> members(distinct.size());
  for (int r = 0; r < n; ++r) {
    const auto node = std::lower_bound(distinct.begin(), distinct.end(), node_ids[static_cast<std::size_t>(r)]) -
                      distinct.begin();
    if (r == rank) {
      table.my_node = static_cast<int>(node);
      table.my_local = static_cast<int>(members[static_cast<std::size_t>(node)].size());
    }
    members[static_cast<std::size_t>(node)].push_back(r);
  }
  // Uneven nodes would give the ranks of a local index shards of different sizes: reject them up front,
  // identically on every rank (the node map is the same everywhere), rather than deadlock.
  const auto [fewest, most] = std::minmax_element(members.begin(), members.end(),
                                                  [](const auto& a, const auto& b) { return a.size() < b.size(); });
  if (fewest->size() != most->size())
    throw std::invalid_argument("hierarchical algorithms need the same number of ranks on every node; nodes hold " +
                     std::to_string(fewest->size()) + " to " + std::to_string(most->size()));
  table.per_node = static_cast<int>(most->size());
  for (const auto& node : members) table.rank_at.insert(table.rank_at.end(), node.begin(), node.end());
  if (comm_size(ctx.intra) != table.per_node || comm_rank(ctx.intra) != table.my_local ||
      comm_size(ctx.inter) != table.nodes || comm_rank(ctx.inter) != table.my_node)
    throw std::runtime_error("the intra and inter communicators do not match the node map (rank " + std::to_string(rank) +
                       ")");
  return table;
}

// Everything sent on intra is intra-node and everything on inter is inter-node, by construction.
Link intra_link(const Context& ctx, const NodeTable& table, Traffic& traffic) {
  return Link(ctx.intra, std::vector<int>(static_cast<std::size_t>(table.per_node), 0), traffic, ctx);
}

Link inter_link(const Context& ctx, const NodeTable& table, Traffic& traffic) {
  std::vector<int> distinct_nodes(static_cast<std::size_t>(table.nodes));
  std::iota(distinct_nodes.begin(), distinct_nodes.end(), 0);
  return Link(ctx.inter, std::move(distinct_nodes), traffic, ctx);
}

// Reduce-scatter inside the node, allreduce of my shard across nodes, allgather inside the node: each rank
// puts only its 1/L shard on the slow inter-node links, where a flat ring would put the whole buffer.
void hierarchical_allreduce(const Context& ctx, const NodeTable& table, std::byte* buf, std::size_t bytes,
                            const Reduction& reduction, Traffic& traffic) {
  Link intra = intra_link(ctx, table, traffic);
  Link inter = inter_link(ctx, table, traffic);
  const std::size_t elem_size = size_of(reduction.dtype);
  const Blocks shards = even_blocks(bytes / elem_size, table.per_node, elem_size);
  ring_reduce_scatter(intra, buf, shards, reduction, kTagAllreduce);
  ring_allreduce(inter, buf + shards[static_cast<std::size_t>(table.my_local)], block_size(shards, table.my_local),
                 reduction, kTagAllreduce);
  ring_allgather(intra, buf, shards, kTagAllreduce);
}

// Staging holds the blocks ordered [local index][node], so that each step works on contiguous runs: first
// the ranks of my local index gather across nodes (each block crosses the inter-node links once), then
// the node's ranks gather those runs. A first intra-node step, as for allreduce, would only add traffic.
void hierarchical_allgather(const Context& ctx, const NodeTable& table, std::byte* recvbuf, std::size_t block,
                            int rank, Traffic& traffic) {
  Link intra = intra_link(ctx, table, traffic);
  Link inter = inter_link(ctx, table, traffic);
  const std::size_t run = static_cast<std::size_t>(table.nodes) * block;
  std::byte* staging = scratch(1, run * static_cast<std::size_t>(table.per_node));
  std::byte* my_run = staging + static_cast<std::size_t>(table.my_local) * run;
  copy_bytes(my_run + static_cast<std::size_t>(table.my_node) * block,
             recvbuf + static_cast<std::size_t>(rank) * block, block);
  ring_allgather(inter, my_run, equal_blocks(block, table.nodes), kTagAllgather);
  ring_allgather(intra, staging, equal_blocks(run, table.per_node), kTagAllgather);
  for (int local = 0; local < table.per_node; ++local)
    for (int node = 0; node < table.nodes; ++node)
      copy_bytes(recvbuf + static_cast<std::size_t>(table.rank_of(node, local)) * block,
                 staging + static_cast<std::size_t>(local) * run + static_cast<std::size_t>(node) * block,
                 block);
}

// The mirror image of the allgather: reduce-scatter runs of [local index][node] blocks inside the node,
// then reduce-scatter my run across nodes, so each block crosses the inter-node links once.
void hierarchical_reduce_scatter(const Context& ctx, const NodeTable& table, const std::byte* sendbuf,
                                 std::byte* recvbuf, std::size_t block, const Reduction& reduction,
                                 Traffic& traffic) {
  Link intra = intra_link(ctx, table, traffic);
  Link inter = inter_link(ctx, table, traffic);
  const std::size_t run = static_cast<std::size_t>(table.nodes) * block;
  std::byte* staging = scratch(1, run * static_cast<std::size_t>(table.per_node));
  for (int local = 0; local < table.per_node; ++local)
    for (int node = 0; node < table.nodes; ++node)
      copy_bytes(staging + static_cast<std::size_t>(local) * run + static_cast<std::size_t>(node) * block,
                 sendbuf + static_cast<std::size_t>(table.rank_of(node, local)) * block, block);
  ring_reduce_scatter(intra, staging, equal_blocks(run, table.per_node), reduction, kTagReduceScatter);
  std::byte* my_run = staging + static_cast<std::size_t>(table.my_local) * run;
  ring_reduce_scatter(inter, my_run, equal_blocks(block, table.nodes), reduction, kTagReduceScatter);
  copy_bytes(recvbuf, my_run + static_cast<std::size_t>(table.my_node) * block, block);
}

// ---- rooted: chain and binomial tree --------------------------------------------------------------------

// Segments are whole elements, at least one.
std::size_t segment_size(const Context& ctx, DataType dtype) {
  const std::size_t elem_size = size_of(dtype);
  return std::max(elem_size, ctx.segment_bytes / elem_size * elem_size);
}

// A pipeline root -> root+1 -> ...: each rank forwards a segment while the next one is still arriving.
void chain_broadcast(Link& link, std::byte* buf, std::size_t bytes, std::size_t segment, int root) {
  const int n = link.size();
  const int position = wrap(link.rank() - root, n);
  for (std::size_t offset = 0; offset < bytes; offset += segment) {
    const std::size_t piece = std::min(segment, bytes - offset);
    if (position > 0) link.recv_now(buf + offset, piece, wrap(link.rank() - 1, n), kTagBroadcast);
    if (position < n - 1) link.post_send(buf + offset, piece, wrap(link.rank() + 1, n), kTagBroadcast);
  }
  link.wait_all();
}

// Position p receives from p minus its lowest set bit, then sends to p + 2^k for the smaller powers.
void binomial_broadcast(Link& link, std::byte* buf, std::size_t bytes, int root) {
  const int n = link.size();
  const int position = wrap(link.rank() - root, n);
  int mask = 1;
  for (; mask < n; mask <<= 1) {
    if ((position & mask) != 0) {
      link.recv_now(buf, bytes, wrap(position - mask + root, n), kTagBroadcast);
      break;
    }
  }
  for (mask >>= 1; mask > 0; mask >>= 1)
    if (position + mask < n) link.post_send(buf, bytes, wrap(position + mask + root, n), kTagBroadcast);
  link.wait_all();
}

// The chain runs towards the root: root-1 starts, each rank adds its data and forwards, segment by segment.
void chain_reduce(Link& link, std::byte* accum, std::size_t bytes, std::size_t segment, int root,
                  const Reduction& reduction) {
  const int n = link.size();
  const int position = wrap(link.rank() - root, n);
  std::byte* incoming = scratch(0, std::min(segment, bytes));
  for (std::size_t offset = 0; offset < bytes; offset += segment) {
    const std::size_t piece = std::min(segment, bytes - offset);
    if (position < n - 1) {
      link.recv_now(incoming, piece, wrap(link.rank() + 1, n), kTagReduce);
      reduction.apply(accum + offset, incoming, piece);
    }
    if (position > 0) link.post_send(accum + offset, piece, wrap(link.rank() - 1, n), kTagReduce);
  }
  link.wait_all();
}

// The broadcast tree run backwards: gather partial results from the children, then send to the parent.
void binomial_reduce(Link& link, std::byte* accum, std::size_t bytes, int root, const Reduction& reduction) {
  const int n = link.size();
  const int position = wrap(link.rank() - root, n);
  std::byte* incoming = scratch(0, bytes);
  for (int mask = 1; mask < n; mask <<= 1) {
    if ((position & mask) != 0) {
      link.send_now(accum, bytes, wrap(position - mask + root, n), kTagReduce);
      return;
    }
    if (position + mask < n) {
      link.recv_now(incoming, bytes, wrap(position + mask + root, n), kTagReduce);
      reduction.apply(accum, incoming, bytes);
    }
  }
}

// ---- entry points -----------------------------------------------------------------------------------------

struct Call {
  int rank;
  int n;
  std::size_t elem_size;
};

Call begin_call(Operation operation, Algo algo, const Context& ctx, DataType dtype) {
  if (!is_supported(operation, algo))
    throw std::invalid_argument(std::string(name(operation)) + " has no " + std::string(name(algo)) + " algorithm");
  const Call call{ctx.rank >= 0 ? ctx.rank : comm_rank(ctx.comm), ctx.size >= 0 ? ctx.size : comm_size(ctx.comm),
                  size_of(dtype)};
  if (!ctx.node_of_rank.empty() && ctx.node_of_rank.size() != static_cast<std::size_t>(call.n))
    throw std::invalid_argument("the node map has " + std::to_string(ctx.node_of_rank.size()) +
                     " entries but the communicator has " + std::to_string(call.n) + " ranks");
  if (algo == Algo::library && ctx.types == nullptr)
    throw std::invalid_argument("the library path needs the MPI types (Context::types)");
  if (ctx.device_copy != nullptr && algo != Algo::library)
    throw std::invalid_argument(std::string(name(algo)) + " " + std::string(name(operation)) +
                     " works on host memory; device buffers take the library algorithm");
  return call;
}

// avg is finished on the host (MPI has no average), which device buffers do not allow.
void refuse_device_avg(const Context& ctx, RedOp op) {
  if (ctx.device_copy != nullptr && op == RedOp::avg)
    throw std::invalid_argument("avg is finished on the host; device buffers take sum, prod, min or max");
}

// A copy between the caller's buffers on the library path, where they may be device memory.
void copy_caller_bytes(const Context& ctx, void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0 || dst == src) return;
  if (ctx.device_copy != nullptr)
    ctx.device_copy(dst, src, bytes);
  else
    std::memmove(dst, src, bytes);
}

int mpi_count(std::size_t count) {
  if (count > static_cast<std::size_t>(INT_MAX))
    throw std::invalid_argument("the MPI library path takes at most " + std::to_string(INT_MAX) + " elements, not " +
                     std::to_string(count));
  return static_cast<int>(count);
}

std::byte* bytes_of(void* buf) { return static_cast<std::byte*>(buf); }
const std::byte* bytes_of(const void* buf) { return static_cast<const std::byte*>(buf); }

}  // namespace

std::string_view name(Algo algo) {
  switch (algo) {
    case Algo::library: return "library";
    case Algo::ring: return "ring";
    case Algo::recursive_doubling: return "recursive_doubling";
    case Algo::hierarchical: return "hierarchical";
    case Algo::horing: return "horing";
    case Algo::shm: return "shm";
  }
  return "?";
}

std::optional<Algo> parse_algo(std::string_view text) {
  for (Algo algo : kAllAlgos)
    if (name(algo) == text) return algo;
  return std::nullopt;
}

Context world_context(const Layout& layout, const MpiTypes& types) {
  Context ctx;
  ctx.comm = MPI_COMM_WORLD;
  ctx.types = &types;
  ctx.node_of_rank = layout.node_of_rank();
  ctx.intra = layout.intra();
  ctx.inter = layout.inter();
  ctx.rank = layout.world_rank();
  ctx.size = layout.world_size();
  return ctx;
}

Traffic allreduce(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op,
                  const Context& ctx) {
  const Call call = begin_call(Operation::allreduce, algo, ctx, dtype);
  refuse_device_avg(ctx, op);
  Traffic traffic;
  if (algo == Algo::library) {
    STRATA_MPI_CHECK(MPI_Allreduce(sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf, recvbuf, mpi_count(count),
                                   ctx.types->datatype(dtype), ctx.types->op(dtype, op), ctx.comm));
  } else {
    const std::size_t bytes = count * call.elem_size;
    // Out of place, the ring reads the input where it is; the other algorithms work on a copy in recvbuf.
    const bool ring_reads_input = algo == Algo::ring && call.n > 1 && sendbuf != recvbuf;
    if (!ring_reads_input) copy_bytes(recvbuf, sendbuf, bytes);
    const Reduction reduction{dtype, op};
    if (algo == Algo::hierarchical) {
      hierarchical_allreduce(ctx, node_table(ctx, call.rank, call.n), bytes_of(recvbuf), bytes, reduction, traffic);
    } else if (count > 0) {
      Link link(ctx.comm, node_map(ctx, call.n), traffic, ctx);
      if (algo == Algo::ring)
        ring_allreduce(link, bytes_of(recvbuf), bytes, reduction, kTagAllreduce,
                       ring_reads_input ? bytes_of(sendbuf) : nullptr);
      else
        recursive_doubling_allreduce(link, bytes_of(recvbuf), bytes, reduction, kTagAllreduce);
    }
  }
  if (op == RedOp::avg) finish_avg(recvbuf, count, dtype, call.n);
  return traffic;
}

Traffic allgather(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                  const Context& ctx) {
  const Call call = begin_call(Operation::allgather, algo, ctx, dtype);
  const std::size_t block = count * call.elem_size;
  std::byte* my_block = bytes_of(recvbuf) + static_cast<std::size_t>(call.rank) * block;
  Traffic traffic;
  if (algo == Algo::library) {
    const MPI_Datatype type = ctx.types->datatype(dtype);
    STRATA_MPI_CHECK(MPI_Allgather(sendbuf == my_block ? MPI_IN_PLACE : sendbuf, mpi_count(count), type, recvbuf,
                                   mpi_count(count), type, ctx.comm));
    return traffic;
  }
  copy_bytes(my_block, sendbuf, block);
  if (algo == Algo::hierarchical) {
    hierarchical_allgather(ctx, node_table(ctx, call.rank, call.n), bytes_of(recvbuf), block, call.rank, traffic);
    return traffic;
  }
  if (count == 0) return traffic;
  Link link(ctx.comm, node_map(ctx, call.n), traffic, ctx);
  const Blocks blocks = equal_blocks(block, call.n);
  if (algo == Algo::ring)
    ring_allgather(link, bytes_of(recvbuf), blocks, kTagAllgather);
  else
    recursive_doubling_allgather(link, bytes_of(recvbuf), blocks, kTagAllgather);
  return traffic;
}

Traffic reduce_scatter(Algo algo, const void* sendbuf, void* recvbuf, std::size_t recvcount, DataType dtype,
                       RedOp op, const Context& ctx) {
  const Call call = begin_call(Operation::reduce_scatter, algo, ctx, dtype);
  refuse_device_avg(ctx, op);
  const std::size_t block = recvcount * call.elem_size;
  const std::size_t total = block * static_cast<std::size_t>(call.n);
  const bool in_place = bytes_of(recvbuf) == bytes_of(sendbuf) + static_cast<std::size_t>(call.rank) * block;
  // In place, the whole input is ours to overwrite; it starts rank blocks before recvbuf.
  std::byte* in_place_input = in_place ? bytes_of(recvbuf) - static_cast<std::size_t>(call.rank) * block : nullptr;
  const Reduction reduction{dtype, op};
  Traffic traffic;
  if (algo == Algo::library) {
    // MPI's in-place variant leaves the result at the start of the buffer, NCCL's at the rank's block.
    STRATA_MPI_CHECK(MPI_Reduce_scatter_block(in_place ? MPI_IN_PLACE : sendbuf, in_place ? in_place_input : recvbuf,
                                              mpi_count(recvcount), ctx.types->datatype(dtype),
                                              ctx.types->op(dtype, op), ctx.comm));
    if (in_place) copy_caller_bytes(ctx, recvbuf, in_place_input, block);
  } else if (algo == Algo::hierarchical) {
    hierarchical_reduce_scatter(ctx, node_table(ctx, call.rank, call.n), bytes_of(sendbuf), bytes_of(recvbuf), block,
                                reduction, traffic);
  } else if (recvcount > 0) {
    std::byte* work = in_place ? in_place_input : scratch(1, total);
    if (!in_place) copy_bytes(work, sendbuf, total);
    Link link(ctx.comm, node_map(ctx, call.n), traffic, ctx);
    const Blocks blocks = equal_blocks(block, call.n);
    if (algo == Algo::ring)
      ring_reduce_scatter(link, work, blocks, reduction, kTagReduceScatter);
    else
      recursive_halving_reduce_scatter(link, work, blocks, reduction, kTagReduceScatter);
    copy_bytes(recvbuf, work + static_cast<std::size_t>(call.rank) * block, block);
  }
  if (op == RedOp::avg) finish_avg(recvbuf, recvcount, dtype, call.n);
  return traffic;
}

Traffic alltoall(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                 const Context& ctx) {
  const Call call = begin_call(Operation::alltoall, algo, ctx, dtype);
  const bool in_place = sendbuf == recvbuf;
  Traffic traffic;
  if (algo == Algo::library) {
    const MPI_Datatype type = ctx.types->datatype(dtype);
    STRATA_MPI_CHECK(MPI_Alltoall(in_place ? MPI_IN_PLACE : sendbuf, mpi_count(count), type, recvbuf,
                                  mpi_count(count), type, ctx.comm));
    return traffic;
  }
  const std::size_t block = count * call.elem_size;
  std::byte* staged = in_place ? scratch(1, block * static_cast<std::size_t>(call.n)) : nullptr;
  if (in_place) copy_bytes(staged, sendbuf, block * static_cast<std::size_t>(call.n));
  const std::byte* source = in_place ? staged : bytes_of(sendbuf);
  auto block_at = [block](auto* buf, int b) { return buf + static_cast<std::size_t>(b) * block; };
  copy_bytes(block_at(bytes_of(recvbuf), call.rank), block_at(source, call.rank), block);
  if (count == 0) return traffic;
  // Pairwise exchange: at step s every rank sends to rank + s and receives from rank - s, so each step is a
  // perfect matching and no rank is the target of two senders at once.
  Link link(ctx.comm, node_map(ctx, call.n), traffic, ctx);
  for (int step = 1; step < call.n; ++step) {
    const int dest = wrap(call.rank + step, call.n);
    const int src = wrap(call.rank - step, call.n);
    link.exchange(block_at(source, dest), block, dest, block_at(bytes_of(recvbuf), src), block, src, kTagAlltoall);
  }
  return traffic;
}

Traffic broadcast(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, int root,
                  const Context& ctx) {
  const Call call = begin_call(Operation::broadcast, algo, ctx, dtype);
  if (root < 0 || root >= call.n)
    throw std::invalid_argument("broadcast root " + std::to_string(root) + " is not a rank of the communicator");
  const std::size_t bytes = count * call.elem_size;
  if (call.rank == root) copy_caller_bytes(ctx, recvbuf, sendbuf, bytes);
  Traffic traffic;
  if (algo == Algo::library) {
    STRATA_MPI_CHECK(MPI_Bcast(recvbuf, mpi_count(count), ctx.types->datatype(dtype), root, ctx.comm));
    return traffic;
  }
  if (count == 0) return traffic;
  Link link(ctx.comm, node_map(ctx, call.n), traffic, ctx);
  if (algo == Algo::ring)
    chain_broadcast(link, bytes_of(recvbuf), bytes, segment_size(ctx, dtype), root);
  else
    binomial_broadcast(link, bytes_of(recvbuf), bytes, root);
  return traffic;
}

Traffic reduce(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op,
               int root, const Context& ctx) {
  const Call call = begin_call(Operation::reduce, algo, ctx, dtype);
  refuse_device_avg(ctx, op);
  if (root < 0 || root >= call.n)
    throw std::invalid_argument("reduce root " + std::to_string(root) + " is not a rank of the communicator");
  const bool is_root = call.rank == root;
  const std::size_t bytes = count * call.elem_size;
  Traffic traffic;
  if (algo == Algo::library) {
    STRATA_MPI_CHECK(MPI_Reduce(is_root && sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf, recvbuf, mpi_count(count),
                                ctx.types->datatype(dtype), ctx.types->op(dtype, op), root, ctx.comm));
  } else {
    // Only the root's recvbuf may be written, so other ranks accumulate in a copy of their input.
    std::byte* accum = is_root ? bytes_of(recvbuf) : scratch(1, bytes);
    copy_bytes(accum, sendbuf, bytes);
    if (count > 0) {
      Link link(ctx.comm, node_map(ctx, call.n), traffic, ctx);
      const Reduction reduction{dtype, op};
      if (algo == Algo::ring)
        chain_reduce(link, accum, bytes, segment_size(ctx, dtype), root, reduction);
      else
        binomial_reduce(link, accum, bytes, root, reduction);
    }
  }
  if (is_root && op == RedOp::avg) finish_avg(recvbuf, count, dtype, call.n);
  return traffic;
}

Traffic sendrecv(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                 const Context& ctx) {
  const Call call = begin_call(Operation::sendrecv, algo, ctx, dtype);
  const int right = wrap(call.rank + 1, call.n);
  const int left = wrap(call.rank - 1, call.n);
  const bool in_place = sendbuf == recvbuf;
  Traffic traffic;
  if (algo == Algo::library) {
    const MPI_Datatype type = ctx.types->datatype(dtype);
    if (in_place)
      STRATA_MPI_CHECK(MPI_Sendrecv_replace(recvbuf, mpi_count(count), type, right, kTagSendrecv, left, kTagSendrecv,
                                            ctx.comm, MPI_STATUS_IGNORE));
    else
      STRATA_MPI_CHECK(MPI_Sendrecv(sendbuf, mpi_count(count), type, right, kTagSendrecv, recvbuf, mpi_count(count),
                                    type, left, kTagSendrecv, ctx.comm, MPI_STATUS_IGNORE));
    return traffic;
  }
  const std::size_t bytes = count * call.elem_size;
  if (call.n == 1 || count == 0) {  // nothing leaves the rank
    copy_bytes(recvbuf, sendbuf, bytes);
    return traffic;
  }
  std::byte* staged = in_place ? scratch(1, bytes) : nullptr;
  if (in_place) copy_bytes(staged, sendbuf, bytes);
  Link link(ctx.comm, node_map(ctx, call.n), traffic, ctx);
  link.exchange(in_place ? staged : bytes_of(sendbuf), bytes, right, bytes_of(recvbuf), bytes, left,
                kTagSendrecv);
  return traffic;
}

}  // namespace strata::coll
