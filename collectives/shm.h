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

  // Any supported operation, with the arguments of algorithms.h (`op` is ignored where nothing is reduced,
  // `root` outside broadcast and reduce). The Work's traffic counts the bytes this rank wrote into its slots
  // for other ranks to read, as intra-node bytes. std::invalid_argument for unsupported operations or bad args.
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
  enum Counter { kReady, kReduced, kDone, kCounterCount };
  struct Call;

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
};

}  // namespace strata::coll
