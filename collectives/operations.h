// The collective operations Strata measures, one table entry each, as nccl-tests has one small file per
// collective: the name, how nccl-tests' size S becomes counts, the bus-bandwidth factor, where the input sits
// in place, the algorithms, the expected result of the check inputs, the bytes the ring sends, and the calls
// (the blocking MPI algorithms of algorithms.h and, where they have it, the process groups' non-blocking one).
// Everything else asks the table rather than switching on the operation. The NCCL call cannot live here
// (NCCL code is built only with CUDA): nccl_calls.cpp holds a parallel array in the order of kAllOperations,
// which the NCCL backend and the NCCL process groups both call, and a static_assert there refuses a table it
// does not cover.
//
// The operations' names and bus factors are operation.h's vocabulary. Adding an operation: its value there, its
// entry in operations.cpp, its blocking call in algorithms.{h,cpp}, and its NCCL call in nccl_calls.cpp.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

#include "collectives/operation.h"  // Operation, name, bus_factor
#include "collectives/types.h"
#include "collectives/work.h"  // Traffic, Work

namespace strata::coll {

struct Context;          // algorithms.h
class Group;             // process_group.h
enum class Waiting;      // process_group.h

// library: the MPI collective. For reduce_scatter recursive_doubling is recursive halving, and for alltoall
// ring is the pairwise exchange. horing: PaRO's hierarchical overlapping ring, the process groups' only (the
// hierarchical algorithm on chunks of the buffer, pipelined so the tiers carry data at once). shm: through a
// segment the ranks of one node share (shm.h), the process groups' only.
enum class Algo { library, ring, recursive_doubling, hierarchical, horing, shm };

inline constexpr auto kAllAlgos = std::to_array<Algo>(
    {Algo::library, Algo::ring, Algo::recursive_doubling, Algo::hierarchical, Algo::horing, Algo::shm});

// A set of algorithms, one bit per Algo.
class Algos {
 public:
  constexpr Algos(std::initializer_list<Algo> algos) {
    for (Algo a : algos) bits_ |= 1u << static_cast<unsigned>(a);
  }
  constexpr bool has(Algo algo) const { return (bits_ >> static_cast<unsigned>(algo)) & 1u; }

 private:
  unsigned bits_ = 0;
};

// Where the input sits when an operation runs in place (NCCL's convention; the rest of the send buffer may
// be overwritten).
enum class InPlace {
  same_buffer,          // sendbuf == recvbuf
  send_in_rank_block,   // allgather: sendbuf == recvbuf + rank * count elements
  recv_in_rank_block,   // reduce_scatter: recvbuf == sendbuf + rank * count elements
};

// Element counts for nccl-tests' size S: the buffer each operation's S refers to, cut into whole elements
// (and whole blocks per rank where the operation splits by rank, rounding down).
struct Counts {
  std::size_t count = 0;           // the count argument of the operation
  std::size_t send_elems = 0;      // elements in the send buffer
  std::size_t recv_elems = 0;      // elements in the receive buffer
  std::size_t size_bytes = 0;      // S actually used
  std::size_t bytes_per_rank = 0;  // OSU's size: one rank's share
};

// One call's arguments, the same for every operation (redop: reductions only; root: rooted ones only).
struct OpArgs {
  const void* sendbuf;
  void* recvbuf;
  std::size_t count;
  DataType dtype;
  RedOp redop = RedOp::sum;
  int root = 0;
};

struct CheckSpec {
  Operation op;
  DataType dtype;
  RedOp redop;
};

struct OperationInfo {
  Operation operation;
  bool reduction;  // takes a RedOp
  bool rooted;     // takes a root
  // The count argument, and the send and receive buffers and OSU's share in elements, for the `elems`
  // elements of S on n ranks (nccl-tests' getCollByteCount); S is the larger buffer.
  struct Elements {
    std::size_t count, send, recv, per_rank;
  };
  Elements (*elements)(std::size_t elems, int n);
  InPlace in_place;
  // Elements `rank` of n sends to its right neighbour when the operation runs as a ring over the ranks in rank
  // order, for the count argument `count` (process_group.cpp's Algo::ring, which is also nccl_plan.h's model of
  // NCCL's ring); null where no ring over the process groups runs it.
  std::size_t (*ring_elements)(std::size_t count, int rank, int n, int root);
  Algos algos;        // the blocking path (algorithms.h)
  Algos group_algos;  // the process groups' non-blocking path (process_group.h)
  // The value of receive-buffer element i on `rank` of n after the operation on the check inputs
  // (check.h); nullopt where the operation leaves it unspecified (reduce off the root).
  std::optional<double> (*expected)(const CheckSpec& spec, std::size_t count, int rank, int n, int root,
                                    std::size_t i);
  Traffic (*run)(Algo algo, const OpArgs& args, const Context& ctx);  // blocking
  // Non-blocking on a process group, for the algorithms in group_algos; null where there are none.
  Work (*start)(Group& group, Algo algo, const OpArgs& args, Waiting waiting);
};

const OperationInfo& info(Operation operation);

bool is_supported(Operation operation, Algo algo);  // on the blocking path
bool is_reduction(Operation operation);
Counts counts_for(Operation operation, std::size_t bytes, std::size_t elem, int n);
// Offsets of the send and receive buffers, in bytes, inside one allocation of max(send, recv) bytes for
// an in-place call of `rank` (NCCL's layout).
struct InPlaceOffsets {
  std::size_t send = 0, recv = 0;
};
InPlaceOffsets in_place_offsets(Operation operation, const Counts& counts, std::size_t elem, int rank);

}  // namespace strata::coll
