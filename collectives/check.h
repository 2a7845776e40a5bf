// What strata-collective checks, independent of how an operation runs: check inputs whose exact results
// are known in every dtype, so each case's output can be verified element by element against the
// operation's expected values (operations.h). nccl-tests' size and bus-bandwidth conventions are in the
// operations table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/operations.h"
#include "collectives/types.h"

namespace strata::coll {

bool is_integer(DataType dtype);

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
