// Strata's own collective algorithms, written over MPI point-to-point messages, next to a library path that
// calls the MPI collective of the same name. Having both under one signature lets a benchmark compare the
// textbook algorithms (ring, recursive doubling, hierarchical) with the library, and count the bytes each
// rank puts on intra-node and inter-node links.
//
// Buffers hold `count` elements of `dtype`. In place means the input already sits where the output goes,
// as in NCCL: sendbuf == recvbuf, except allgather (sendbuf == recvbuf + rank * count elements) and
// reduce_scatter (recvbuf == sendbuf + rank * recvcount elements). In place, the rest of the send buffer
// may be overwritten. Every rank of the communicator must call with the same algo, count, dtype, op, root.
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "collectives/operations.h"  // Algo, Operation
#include "collectives/types.h"
#include "collectives/work.h"  // Traffic

namespace strata::coll {

class Layout;

std::string_view name(Algo algo);  // "library", "ring", "recursive_doubling", "hierarchical"
std::optional<Algo> parse_algo(std::string_view text);

// Where a collective runs.
struct Context {
  MPI_Comm comm = MPI_COMM_WORLD;
  const MpiTypes* types = nullptr;  // needed by the library path only
  // Node index of each rank of comm, for the traffic split and the hierarchical algorithms. Empty: one node.
  std::vector<int> node_of_rank;
  // Hierarchical only: the ranks of comm on my node (ordered by comm rank), and the ranks of comm with my
  // local index (one per node, ordered by node index). Every node must hold the same number of ranks.
  MPI_Comm intra = MPI_COMM_NULL;
  MPI_Comm inter = MPI_COMM_NULL;
  // This rank's rank in comm and comm's size, when the caller knows them (world_context fills them): a
  // latency-bound call then asks MPI nothing before communicating. -1: asked per call.
  int rank = -1;
  int size = -1;
  // Broadcast and reduce chains forward in pieces of this size, so every link of the chain is busy at once.
  std::size_t segment_bytes = std::size_t{128} << 10;
  // The ring's reduction steps move this much at a time: big enough that per-message costs vanish, small
  // enough that the two receive slots stay in cache while they are reduced.
  std::size_t ring_segment_bytes = std::size_t{1} << 20;
  // MPI counts are int: larger messages go as several pieces of at most this many bytes (capped at INT_MAX).
  // Tests set it small so the splitting runs on small buffers.
  std::size_t max_message_bytes = std::size_t{1} << 30;
  // Set when the buffers are device memory (a CUDA-aware MPI library): the copy the library path makes
  // between the caller's buffers (broadcast out of place on the root, reduce_scatter in place) goes through
  // it, since the host cannot touch device memory. Strata's own algorithms and the host-side finish of avg
  // work on host memory, so with it set they are refused (std::invalid_argument). Null: host buffers.
  void (*device_copy)(void* dst, const void* src, std::size_t bytes) = nullptr;
};

// MPI_COMM_WORLD with the layout's node map and communicators.
Context world_context(const Layout& layout, const MpiTypes& types);

// Unsupported (operation, algo) pairs and bad arguments throw std::invalid_argument.
Traffic allreduce(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op,
                  const Context& ctx);
// count elements from each rank; recvbuf holds size * count, in rank order.
Traffic allgather(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                  const Context& ctx);
// sendbuf holds size * recvcount; rank r receives block r of the reduction.
Traffic reduce_scatter(Algo algo, const void* sendbuf, void* recvbuf, std::size_t recvcount, DataType dtype,
                       RedOp op, const Context& ctx);
// count elements to each rank: block d of sendbuf goes to rank d, block s of recvbuf comes from rank s.
Traffic alltoall(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                 const Context& ctx);
// root's sendbuf lands in every rank's recvbuf; sendbuf is read on the root only.
Traffic broadcast(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, int root,
                  const Context& ctx);
// The reduction lands in root's recvbuf; recvbuf is written on the root only.
Traffic reduce(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype, RedOp op,
               int root, const Context& ctx);
// Send to rank + 1, receive from rank - 1 (around the ring): the neighbour exchange of pipeline parallelism.
Traffic sendrecv(Algo algo, const void* sendbuf, void* recvbuf, std::size_t count, DataType dtype,
                 const Context& ctx);

}  // namespace strata::coll
