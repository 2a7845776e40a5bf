// The process groups of a training job, built once (as Megatron-Core's parallel_state builds them), and
// non-blocking collectives and point-to-point operations on any of them.
//
// Groups: the world; each grid dimension (tp, pp, dp) with a configurable order of the dimensions, fastest
// varying first (default tp, pp, dp: tensor parallelism inside a node); and inside data parallelism the
// intra group (the DP ranks on my node, real or emulated) and the inter group (the DP ranks with my index
// inside their node, one per node), which partial-redundancy strategies (PaRO) shard and reduce over.
//
// Every operation returns a Work (work.h says how it progresses). Collectives: every rank of the group
// starts the same collectives in the same order, with the same algorithm, count, dtype and operation.
// Point-to-point: each send to a peer matches that peer's receive from this rank, in order. Any number of
// operations may be in flight on one group.
//
// Buffers follow NCCL: in place means sendbuf == recvbuf, except allgather (sendbuf == recvbuf + rank *
// count elements) and reduce_scatter (recvbuf == sendbuf + rank * recvcount elements).
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/layout.h"
#include "collectives/mpi_error.h"
#include "collectives/operations.h"
#include "collectives/shm.h"
#include "collectives/types.h"
#include "collectives/work.h"

namespace strata::coll {

// When the caller waits for a collective. later: it overlaps the operation with other work, and the library
// algorithm starts MPI's non-blocking collective. at_once: it waits right after starting, and the library
// algorithm calls MPI's blocking collective, which MPI libraries implement apart and faster for small
// messages (Open MPI 4.1, 8 B on two ranks: about 0.3 us against 0.7 us for MPI_Iallreduce and its wait),
// returning a complete Work. Strata's own algorithms run the same either way. Every rank of the group passes
// the same value: a blocking collective never matches a non-blocking one.
enum class Waiting { later, at_once };

class Group;

// A group can stand for ranks that are not running (a trace of a job larger than the one at hand): a traced group
// has no communicator, and hands its operations to a GroupTrace, which records them and returns operations that
// complete when the trace says so. count and dtype are the operation's arguments (allgather: each rank's block;
// reduce_scatter: each rank's result).
class GroupTrace {
 public:
  virtual ~GroupTrace() = default;
  virtual Work collective(const Group& group, Operation operation, Algo algo, std::size_t count, DataType dtype) = 0;
  virtual Work point_to_point(const Group& group, bool send, int peer, std::size_t count, DataType dtype) = 0;
};

class Group {
 public:
  // Collective over `comm` (which the group takes over). `node_of_rank[r]` is the node of group rank r.
  // Splits the intra and inter communicators that the hierarchical algorithms use.
  Group(std::string name, Comm comm, std::vector<int> node_of_rank, const MpiTypes& types);
  // A traced group: `world_ranks` are its members in group order, `rank` my place among them. No MPI.
  Group(std::string name, std::vector<int> world_ranks, int rank, std::vector<int> node_of_rank, GroupTrace& trace);
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;
  ~Group();

  const std::string& name() const { return name_; }
  MPI_Comm comm() const { return comm_.get(); }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::vector<int>& node_of_rank() const { return node_of_rank_; }
  int node_count() const { return node_count_; }
  bool even_nodes() const { return even_nodes_; }  // every node holds the same number of the group's ranks
  bool traced() const { return trace_ != nullptr; }
  const std::vector<int>& world_ranks() const { return world_ranks_; }  // a traced group's members; empty otherwise

  // The same ranks in another order: rank r at position key_of_rank[r] (a permutation). Collective.
  std::unique_ptr<Group> reordered(std::string name, const std::vector<int>& key_of_rank) const;
  // The ranks at `members` (ranks of this group, in that order); nullptr on the others. Collective.
  std::unique_ptr<Group> subgroup(std::string name, const std::vector<int>& members) const;

  // Algorithms: library (MPI_I* collectives), ring, hierarchical (reduce-scatter in the node, the shard
  // across nodes among ranks of the same local index, allgather in the node; needs even nodes), horing
  // (HO-Ring: the hierarchical algorithm on chunks of horing_chunk_bytes, up to kHoRingWindow in flight, so
  // chunk k's intra-node phase runs while chunk k-1 crosses nodes on the m concurrent inter-node rings; the
  // bytes per tier are the hierarchical algorithm's), shm (through a segment the group's ranks share,
  // shm.h; the group must live on one machine; the segment is made at the first shm call, collectively).
  // Broadcast: library, ring (a pipelined chain from the root) or shm. std::invalid_argument for other pairs
  // or bad args.
  //
  // The library's blocking calls on MPI's own datatypes and reductions are the MPI call itself, inline here:
  // a latency-bound call then costs what a bare MPI call costs (strata-bench-collectives' figure 3), where the
  // general path's checks and calls across translation units cost a 0.1 us broadcast 8-10 ns once ranks share
  // cores (every line of code and data between the clock reads is then a cache miss).
  Work allreduce(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op,
                 Waiting waiting = Waiting::later) {
    if (!plain_library_call(algo, waiting, dtype) || op == RedOp::avg)
      return allreduce_general(algo, sendbuf, recvbuf, count, dtype, op, waiting);
    STRATA_MPI_CHECK(MPI_Allreduce(sendbuf == recvbuf ? MPI_IN_PLACE : sendbuf, recvbuf, static_cast<int>(count),
                                   native_mpi_datatype(dtype), native_mpi_op(op), comm_.get()));
    return Work();
  }
  Work reduce_scatter(Algo algo, const void* sendbuf, void* recvbuf, std::size_t recvcount, DataType dtype, RedOp op,
                      Waiting waiting = Waiting::later) {
    // In place, MPI leaves the result at the buffer's start and NCCL at the rank's block: the general path.
    const std::size_t my_block = static_cast<std::size_t>(rank_) * recvcount * size_of(dtype);
    const bool in_place = recvbuf == static_cast<const std::byte*>(sendbuf) + my_block;
    if (!plain_library_call(algo, waiting, dtype) || op == RedOp::avg || in_place)
      return reduce_scatter_general(algo, sendbuf, recvbuf, recvcount, dtype, op, waiting);
    STRATA_MPI_CHECK(MPI_Reduce_scatter_block(sendbuf, recvbuf, static_cast<int>(recvcount),
                                              native_mpi_datatype(dtype), native_mpi_op(op), comm_.get()));
    return Work();
  }
  Work allgather(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                 Waiting waiting = Waiting::later) {
    if (!plain_library_call(algo, waiting, dtype))
      return allgather_general(algo, sendbuf, recvbuf, count, dtype, waiting);
    const std::size_t my_block = static_cast<std::size_t>(rank_) * count * size_of(dtype);
    const bool in_place = sendbuf == static_cast<std::byte*>(recvbuf) + my_block;
    const MPI_Datatype type = native_mpi_datatype(dtype);
    STRATA_MPI_CHECK(MPI_Allgather(in_place ? MPI_IN_PLACE : sendbuf, static_cast<int>(count), type, recvbuf,
                                   static_cast<int>(count), type, comm_.get()));
    return Work();
  }
  Work broadcast(Algo algo, void* buf, std::size_t count, DataType dtype, int root, Waiting waiting = Waiting::later) {
    if (!plain_library_call(algo, waiting, dtype) || root < 0 || root >= size_)
      return broadcast_general(algo, buf, count, dtype, root, waiting);
    STRATA_MPI_CHECK(MPI_Bcast(buf, static_cast<int>(count), native_mpi_datatype(dtype), root, comm_.get()));
    return Work();
  }
  Work send(const void* buf, std::size_t count, DataType dtype, int peer);
  Work recv(void* buf, std::size_t count, DataType dtype, int peer);

  static bool supports(Operation operation, Algo algo);  // the operations table's group_algos

  // HO-Ring's chunk: large enough that a chunk's messages are bandwidth-bound, small enough to pipeline. At
  // most kHoRingChunks chunks (the chunk grows for larger buffers), so one operation takes a bounded number of
  // tags. Tests set it small.
  std::size_t horing_chunk_bytes = std::size_t{1} << 20;
  static constexpr int kHoRingChunks = 16;
  static constexpr int kHoRingWindow = 3;  // chunks in flight: one per phase (intra, inter, intra)
  // The ring's reduction steps (Algo::ring, and the hierarchical algorithms' and HO-Ring's phases of messages)
  // move this much at a time, as algorithms.h's Context::ring_segment_bytes; point-to-point messages larger than
  // max_message_bytes (at most INT_MAX) go as several, as Context::max_message_bytes. The same on every rank of
  // the group, set before its operations start. Tests set them small so the segments and the splitting run.
  std::size_t ring_segment_bytes = std::size_t{1} << 20;
  std::size_t max_message_bytes = std::size_t{1} << 30;
  ShmOptions shm_options;                  // for the segments, before the first call that makes one
  // The hierarchical algorithms' and HO-Ring's phases inside a node go through shared memory (shm.h) where
  // the group's ranks on the node share memory and are at least two (an allreduce also needs a count, or
  // HO-Ring chunk, that divides among them); false: MPI messages, as on nodes where they do not share it.
  // The same on every rank. With shared memory, a node's ranks run those phases in the order the operations
  // were started: progress operations on one group in the order started (wait for the oldest, or test all).
  bool intra_shm = true;
  // Memory registered with Algo::shm's segment (made here if not yet; collective over the group, whose ranks
  // must share memory): shm operations on it take the direct path (shm.h). Destroy it before the group.
  ShmBuffer allocate_shm(std::size_t bytes) { return shm().allocate(bytes); }

 private:
  // The hierarchical algorithm on one piece of a collective, with its own tag (HO-Ring runs several at once).
  // Strides are the bytes between consecutive ranks' blocks in the full buffers.
  // `turns`: the operation's places on the node's shared-memory segments, if its intra phases use them.
  struct IntraTurns {
    std::optional<ShmNode::Reservation> first, last;  // the first intra phase's, the last one's
  };
  Work hierarchical_allreduce(std::byte* buf, std::size_t count, DataType dtype, RedOp op, int tag,
                              std::optional<IntraTurns> turns);
  Work hierarchical_reduce_scatter(const std::byte* in, std::size_t in_stride, std::byte* out, std::size_t recvcount,
                                   DataType dtype, RedOp op, int tag, std::optional<IntraTurns> turns);
  Work hierarchical_allgather(const std::byte* in, std::byte* out, std::size_t out_stride, std::size_t count,
                              DataType dtype, int tag, std::optional<IntraTurns> turns);
  // HO-Ring: `elements` cut into chunks (a multiple of `granule` elements but the last); start(first, count,
  // tag, turns) starts the hierarchical algorithm on one, with its tag and turns taken at the call.
  using ChunkStart = std::function<Work(std::size_t first, std::size_t count, int tag, std::optional<IntraTurns> turns)>;
  Work horing(Operation operation, std::size_t elements, std::size_t esize, std::size_t granule, const ChunkStart& start);
  // The turns of one operation (the phases `operation` has inside the node) when it runs through shared memory
  // (every intra phase exact: `count` divides among the node's ranks where an allreduce splits it).
  std::optional<IntraTurns> take_intra_turns(Operation operation, std::size_t count);
  // Scratch for one operation, kept until the operation is destroyed and then kept for later ones: a fresh
  // allocation of a large buffer costs its page faults on every call. Uninitialised.
  std::shared_ptr<std::byte> take_scratch(std::size_t bytes);
  struct SpareScratch {
    struct Buffer {
      std::size_t bytes = 0;
      std::unique_ptr<std::byte[]> data;
    };
    static constexpr std::size_t kKept = 8;  // enough for HO-Ring's window and a few operations in flight
    std::vector<Buffer> buffers;
  };
  std::shared_ptr<SpareScratch> spare_scratch_ = std::make_shared<SpareScratch>();
  ShmNode& shm();
  std::unique_ptr<ShmNode> shm_;
  // Two segments over the node's ranks: every operation's first intra phase runs on one, its last on the
  // other, so an operation's last phase, ready only after its inter-node phase, never holds up the next
  // operation's first. Made at the first operation that uses them; unavailable when they do not share memory.
  enum class IntraShm { unknown, unavailable, available };
  IntraShm intra_shm_state_ = IntraShm::unknown;
  std::unique_ptr<ShmNode> intra_first_, intra_last_;

  int next_collective_tag();
  // A blocking library call MPI runs with its own datatype. MPI's blocking and non-blocking collectives do not
  // match each other, so every rank of a call takes the same path, and the tags stay in step.
  bool plain_library_call(Algo algo, Waiting waiting, DataType dtype) const {
    return algo == Algo::library && waiting == Waiting::at_once && !trace_ &&
           native_mpi_datatype(dtype) != MPI_DATATYPE_NULL;
  }
  Work allreduce_general(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op,
                         Waiting waiting);
  Work reduce_scatter_general(Algo algo, const void* sendbuf, void* recvbuf, std::size_t recvcount, DataType dtype,
                              RedOp op, Waiting waiting);
  Work allgather_general(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                         Waiting waiting);
  Work broadcast_general(Algo algo, void* buf, std::size_t count, DataType dtype, int root, Waiting waiting);
  int next_tag(std::vector<unsigned>& sequence, int peer);

  std::string name_;
  Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> node_of_rank_;
  int node_count_ = 1;
  bool even_nodes_ = true;
  Comm intra_, inter_;
  std::vector<int> intra_nodes_, inter_nodes_;  // node of each rank of intra_ / inter_, for traffic
  const MpiTypes* types_ = nullptr;
  GroupTrace* trace_ = nullptr;
  std::vector<int> world_ranks_;
  unsigned collective_sequence_ = 0;
  std::vector<unsigned> send_sequence_, recv_sequence_;  // per peer
};

// The order of the grid dimensions, fastest varying first: world rank = i0 + n0 * (i1 + n1 * i2).
// "tp,pp,dp" (default), or any permutation; std::invalid_argument otherwise.
std::vector<std::string> parse_grid_order(const std::string& text);
// The world-rank stride of each grid coordinate (tp, pp, dp) under `order` (parse_grid_order's): a rank's world rank is
// the sum of its coordinates times their strides, as ProcessGroups places ranks.
std::array<int, 3> grid_strides(const GridShape& grid, const std::vector<std::string>& order);

class ProcessGroups {
 public:
  // Collective over MPI_COMM_WORLD. ranks_per_node 0: real nodes (ranks sharing memory); otherwise emulated
  // nodes of that many consecutive world ranks. The grid must multiply to the world size.
  ProcessGroups(const GridShape& grid, int ranks_per_node = 0, const std::string& order = "tp,pp,dp");
  // The groups of world rank `rank` of a job with this grid and `ranks_per_node` ranks per node (at least 1),
  // traced: no MPI, every operation handed to `trace` (GroupTrace). The same membership as the collective
  // constructor builds.
  ProcessGroups(const GridShape& grid, int ranks_per_node, const std::string& order, int rank, GroupTrace& trace);
  ProcessGroups(const ProcessGroups&) = delete;
  ProcessGroups& operator=(const ProcessGroups&) = delete;

  const GridShape& grid() const { return grid_; }
  const std::vector<std::string>& order() const { return order_; }
  int tp_index() const { return index_[0]; }
  int pp_index() const { return index_[1]; }
  int dp_index() const { return index_[2]; }
  // The world rank at grid coordinates (tp, pp, dp).
  int world_rank_of(int tp, int pp, int dp) const;

  Group& world() { return *world_; }
  Group& tp() { return *tp_; }
  Group& pp() { return *pp_; }
  Group& dp() { return *dp_; }
  Group& dp_intra() { return *dp_intra_; }
  Group& dp_inter() { return *dp_inter_; }
  const MpiTypes& types() const { return *types_; }  // not for traced groups

 private:
  GridShape grid_;
  std::vector<std::string> order_;
  int stride_[3] = {1, 1, 1};  // stride of tp, pp, dp in world rank
  int index_[3] = {0, 0, 0};   // my tp, pp, dp coordinates
  std::unique_ptr<MpiTypes> types_;
  std::unique_ptr<Group> world_, tp_, pp_, dp_, dp_intra_, dp_inter_;
};

}  // namespace strata::coll
