// Collectives among the ranks of one node through a shared-memory segment every rank maps, instead of MPI
// point-to-point messages (which move large messages with an extra kernel-mediated copy).
//
// The segment (MPI_Win_allocate_shared) holds, per rank, three counters on their own cache lines and a ring
// of `slots` slots of `slot_bytes`. A collective is cut into chunks of at most one slot; chunk k of the node's
// history (numbered across calls) uses slot k % slots of every rank, in three phases:
//   fill     each rank copies its input of the chunk into its own slot, then publishes ready = k + 1;
//   combine  (reductions) each rank reduces its sub-slice of the chunk over every rank's slot, once every
//            ready >= k + 1, in place in its own slot (or into its output), then publishes reduced = k + 1;
//   drain    each rank that receives copies the chunk out of the slots, once every reduced (ready, for
//            copies) >= k + 1; then, its last read of chunk k done, it publishes done = k + 1.
// A rank refills a slot for chunk k + slots only once every done >= k + 1, so no slot is overwritten while a
// rank still reads it, and no rank reads a slot before its writer's release store of the counter (torn reads).
// Each rank publishes every counter for every chunk in chunk order, also across operations in flight (a phase
// of chunk k waits for the rank's own counter to stand at k), so counters only grow (acquire loads, release
// stores) and a rank can run ahead by the ring's depth.
// The phases are pipelined with a lag: in one step a rank drains chunk t - 2, combines t - 1 and fills t, so
// the chunks on the slots ring are read, reduced and written at once, and a rank waits only on a rank a
// whole step behind it. Only the input is read from, and only the output written to, memory beyond the
// caches: the slots stay in them.
//
// Buffers and arguments follow collectives/algorithms.h: `count` elements (allgather: per rank;
// reduce_scatter: recvcount per rank); in place means sendbuf == recvbuf, except allgather (sendbuf ==
// recvbuf + rank * count elements) and reduce_scatter (recvbuf == sendbuf + rank * recvcount elements).
// Every rank of the node calls the same operations in the same order with the same count, dtype, op, root.
//
// Non-blocking: start() returns a Work that progresses in Work::test()/wait() (work.h). Operations on one
// ShmNode run in the order started, any number in flight; testing any of them progresses every earlier one
// too, since a later operation's chunks need the slots the earlier ones hold. A ShmNode must outlive its
// Works; a waiting rank polls, pausing and yielding its core now and then (ranks may share cores).
//
// Registered buffers (allocate(): memory every rank of the node maps, as NCCL's registered user buffers or an
// MPI library's XPMEM/CMA single-copy path): an operation whose buffers all lie in this node's registered
// memory skips the slots and touches each byte once, as a copy does (the direct path). Every rank publishes,
// on its arrival counter's cache line, which registered allocation and offset its buffers are at (they may
// differ from rank to rank), then each does its share straight between the ranks' buffers (a reduction in one
// pass, reduce_into_all; 1/n means whole 64-byte lines):
//   allreduce       reduces its 1/n of the elements over every rank's input, writes the result to every output;
//   reduce_scatter  reduces its own block over every rank's input into its output;
//   allgather       writes its block into every rank's output;
//   broadcast       copies its 1/n of the root's input to every output that needs it;
//   reduce          reduces its 1/n of the elements over every rank's input into the root's output.
// Each rank publishes arrived = ticket once every earlier operation of the node is complete on it, starts its
// share once every rank arrived, publishes finished = ticket, and completes once every rank finished, so no
// rank's buffers are read or written after it returns. Contract: an operation's buffers (those it reads or
// writes on the rank: not a non-root's input of broadcast nor a non-root's output of reduce) are registered on
// every rank or on none; where only some ranks pass registered buffers they take different paths and wait for
// each other forever (the job's timeout ends it). Zero counts touch nothing and take neither path. Since a
// direct operation waits for the earlier ones, its input may be the output of one still in flight.
//
// An operation whose input is ready only later, at a moment that differs from rank to rank (the allgather
// that ends a hierarchical allreduce, after its inter-node phase), takes its place in the order early with
// reserve() and is started on that reservation when its input is there; the operations behind it wait.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "collectives/algorithms.h"  // Operation
#include "collectives/mpi.h"         // Comm
#include "collectives/types.h"
#include "collectives/work.h"

namespace strata::coll {

struct ShmOptions {
  // Bytes of one slot: big enough that the per-chunk synchronisation vanishes, small enough that every
  // rank's ring of slots stays in the last-level cache. A multiple of 64, at least 8 x ranks.
  std::size_t slot_bytes = std::size_t{256} << 10;
  int slots = 4;  // the ring's depth, at least 2
  // Outputs of at least this many bytes are written with non-temporal stores: they will not fit in the cache
  // anyway, and streaming them saves reading each line before writing it. 0: never.
  std::size_t stream_min_bytes = std::size_t{4} << 20;
  // Fill the slots with non-temporal stores too, so readers take the chunks from memory rather than from the
  // writer's cache. Slower where the ranks' cores share a cache (the default), faster where moving modified
  // lines between their caches is slow (cores far apart, as a virtual machine's may be placed).
  bool stream_slots = false;
};

class ShmNode;

// Memory of one ShmNode::allocate() call: this rank's part, page-aligned, mapped by every rank of the node.
// Destruction is collective (every rank of the node destroys its buffers in the same order); it first completes
// the node's operations in flight. Must not outlive its ShmNode.
class ShmBuffer {
 public:
  ShmBuffer() = default;
  ShmBuffer(ShmBuffer&& other) noexcept;
  ShmBuffer& operator=(ShmBuffer&& other) noexcept;
  ShmBuffer(const ShmBuffer&) = delete;
  ShmBuffer& operator=(const ShmBuffer&) = delete;
  ~ShmBuffer();

  std::byte* data() const { return data_; }
  std::size_t size() const { return bytes_; }
  template <typename T>
  T* as() const {
    return reinterpret_cast<T*>(data_);
  }

 private:
  friend class ShmNode;
  void release() noexcept;
  ShmNode* node_ = nullptr;
  std::uint64_t id_ = 0;
  MPI_Win window_ = MPI_WIN_NULL;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

class ShmNode {
 public:
  // Collective over `comm`, whose ranks must all share memory (std::invalid_argument otherwise, or for bad
  // options). The segment lives until destruction, which is collective too and waits for operations in flight.
  explicit ShmNode(MPI_Comm comm, ShmOptions options = {});
  ~ShmNode();
  ShmNode(const ShmNode&) = delete;
  ShmNode& operator=(const ShmNode&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const ShmOptions& options() const { return options_; }
  static bool supports(Operation operation);  // allreduce, allgather, reduce_scatter, broadcast, reduce

  // Collective over the node: `bytes` of memory (they may differ from rank to rank) that every rank maps, for
  // operations on the direct path (above). Page-aligned. Completes the operations in flight first, so that a
  // rank that waited for them before the call and one that did not meet in it.
  ShmBuffer allocate(std::size_t bytes);
  // Whether [data, data + bytes) lies inside one of this node's registered buffers on this rank.
  bool registered(const void* data, std::size_t bytes) const { return find(data, bytes).has_value(); }
  // Operations started on the direct path so far.
  std::uint64_t direct_operations() const { return direct_operations_; }

  // Any supported operation, with the arguments of algorithms.h (`op` is ignored where nothing is reduced,
  // `root` outside broadcast and reduce). The Work's traffic counts, as intra-node bytes, the bytes this rank
  // wrote into its slots for other ranks to read, or on the direct path the bytes it read from or wrote into
  // other ranks' buffers. std::invalid_argument for unsupported operations or bad args.
  Work start(Operation operation, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
             RedOp op = RedOp::sum, int root = 0) {
    return start(reserve(), operation, sendbuf, recvbuf, count, dtype, op, root);
  }

  // A place in the node's order of operations, for one operation started on it later. Every rank of the node
  // reserves in the same order. One destroyed unstarted runs as an empty operation, so those behind it go on
  // (every rank of the node must drop it then). Must not outlive its ShmNode.
  class Reservation {
   public:
    Reservation(Reservation&&) noexcept = default;
    Reservation& operator=(Reservation&&) noexcept;
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    ~Reservation();

   private:
    friend class ShmNode;
    struct Pending;
    explicit Reservation(std::shared_ptr<Pending> pending) : pending_(std::move(pending)) {}
    std::shared_ptr<Pending> pending_;
  };
  Reservation reserve();
  Work start(Reservation reservation, Operation operation, const void* sendbuf, void* recvbuf, std::size_t count,
             DataType dtype, RedOp op = RedOp::sum, int root = 0);
  void run(Operation operation, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
           RedOp op = RedOp::sum, int root = 0) {
    start(operation, sendbuf, recvbuf, count, dtype, op, root).wait();
  }

  void allreduce(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op) {
    run(Operation::allreduce, sendbuf, recvbuf, count, dtype, op);
  }
  void allgather(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype) {
    run(Operation::allgather, sendbuf, recvbuf, count, dtype);
  }
  void reduce_scatter(const void* sendbuf, void* recvbuf, std::size_t recvcount, DataType dtype, RedOp op) {
    run(Operation::reduce_scatter, sendbuf, recvbuf, recvcount, dtype, op);
  }
  void broadcast(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, int root) {
    run(Operation::broadcast, sendbuf, recvbuf, count, dtype, RedOp::sum, root);
  }
  void reduce(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op, int root) {
    run(Operation::reduce, sendbuf, recvbuf, count, dtype, op, root);
  }
  Work iallreduce(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op) {
    return start(Operation::allreduce, sendbuf, recvbuf, count, dtype, op);
  }
  Work iallgather(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype) {
    return start(Operation::allgather, sendbuf, recvbuf, count, dtype);
  }
  Work ireduce_scatter(const void* sendbuf, void* recvbuf, std::size_t recvcount, DataType dtype, RedOp op) {
    return start(Operation::reduce_scatter, sendbuf, recvbuf, recvcount, dtype, op);
  }
  Work ibroadcast(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, int root) {
    return start(Operation::broadcast, sendbuf, recvbuf, count, dtype, RedOp::sum, root);
  }
  Work ireduce(const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op, int root) {
    return start(Operation::reduce, sendbuf, recvbuf, count, dtype, op, root);
  }

 private:
  enum Counter { kReady, kReduced, kDone, kArrived, kFinished, kCounterCount };
  struct Call;
  // Where a buffer lies in registered memory: the allocation (numbered alike on every rank) and the offset.
  struct Ref {
    std::uint64_t id = 0;  // 0: no buffer
    std::uint64_t offset = 0;
  };
  struct Registered {
    std::uint64_t id;
    const std::byte* data;
    std::size_t bytes;
    std::vector<std::byte*> parts;  // every rank's part, mapped here
  };
  friend class ShmBuffer;

  Step pipeline(Call call, std::uint64_t first_chunk, Traffic* traffic);
  Step in_turn(std::shared_ptr<Reservation::Pending> pending);
  void fill(const Call& c, std::size_t chunk, std::uint64_t k, Traffic& traffic);
  void combine(const Call& c, std::size_t chunk, std::uint64_t k);
  void drain(const Call& c, std::size_t chunk, std::uint64_t k);
  bool drains(const Call& c) const;
  std::byte* slot(int rank, std::uint64_t k) const;
  std::uint64_t* counter(int rank, Counter which) const;
  void publish(Counter which, std::uint64_t value) const;
  std::uint64_t mine(Counter which) const;  // this rank's own counter
  void to_slot(std::byte* slot, const std::byte* src, std::size_t bytes) const;
  bool everyone_reached(Counter which, std::uint64_t value) const;
  // Progresses every operation in flight; true once the one with this ticket is complete.
  bool progress(std::uint64_t ticket);
  void complete_in_flight();

  std::optional<Ref> find(const void* data, std::size_t bytes) const;
  std::byte* at(int rank, Ref ref) const;  // null for no buffer
  Step direct(Call call, std::uint64_t ticket, Traffic* traffic);
  void direct_share(const Call& c, const std::vector<const std::byte*>& send, const std::vector<std::byte*>& recv,
                    Traffic& traffic);

  ShmOptions options_;
  int rank_ = 0;
  int size_ = 1;
  MPI_Win window_ = MPI_WIN_NULL;
  std::vector<std::byte*> base_;  // each rank's part of the segment, mapped here
  std::uint64_t next_chunk_ = 0;  // the next chunk number of the node's history
  std::deque<Work> in_flight_;    // started and not yet seen complete, in the order started
  std::uint64_t started_ = 0, finished_ = 0;
  std::uint64_t numbered_ = 0;    // the last ticket whose chunks are numbered (in ticket order)
  unsigned idle_polls_ = 0;
  Comm comm_;                          // a duplicate of the node's communicator, for allocate()
  std::vector<Registered> registered_;  // this node's live buffers
  std::uint64_t allocations_ = 0;      // allocate() calls so far: the last buffer's id
  std::uint64_t direct_operations_ = 0;
};

}  // namespace strata::coll
