// What strata-collective measures and checks, independent of how an operation runs: nccl-tests' size
// and bus-bandwidth conventions, and check inputs whose exact results are known in every dtype, so each
// case's output can be verified element by element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/types.h"

namespace strata::coll {

bool is_integer(DataType dtype);
bool is_reduction(Operation operation);

// nccl-tests' bus bandwidth factor for n ranks: allreduce 2(n-1)/n; allgather, reduce_scatter,
// alltoall (n-1)/n; the rest 1.
double bus_factor(Operation operation, int n);

// Element counts for nccl-tests' size S: the buffer each operation's S refers to, cut into whole elements
// (and whole blocks per rank where the operation splits by rank, rounding down as nccl-tests does).
struct Counts {
  std::size_t count = 0;           // the count argument of the operation
  std::size_t send_elems = 0;      // elements in the send buffer
  std::size_t recv_elems = 0;      // elements in the receive buffer
  std::size_t size_bytes = 0;      // S actually used
  std::size_t bytes_per_rank = 0;  // OSU's size: one rank's share
};
Counts counts_for(Operation operation, std::size_t bytes, std::size_t elem, int n);

struct CheckSpec {
  Operation op;
  DataType dtype;
  RedOp redop;
};

// Check input of `rank` at element i.
double check_input(Operation op, RedOp redop, int rank, std::size_t i);
// The exact reduction of check_input over n ranks at element i, as the dtype stores it.
double expected_reduction(RedOp redop, DataType dtype, int n, std::size_t i, Operation op);
// Exact equality, except averages of floating types (rounded twice): one unit in the last place.
bool matches(double got, double expected, DataType dtype, RedOp redop);

// The host image of a rank's send buffer for the check, and the number of output elements (in the host
// image of its receive buffer) that differ from the exact result. `rank` and `size` are in the group.
std::vector<unsigned char> check_inputs(const CheckSpec& spec, const Counts& counts, int rank);
std::int64_t count_wrong(const CheckSpec& spec, const Counts& counts, const std::vector<unsigned char>& out, int rank,
                         int size, int root);

}  // namespace strata::coll
