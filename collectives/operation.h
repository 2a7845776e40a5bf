// The collective operations' vocabulary: their names and nccl-tests' bus-bandwidth factors, the one list every layer
// speaks of (the benchmark, the step's trace, the projection's cost models). Depends on nothing, so the projection,
// which knows no MPI, includes it alone. What an operation does (counts, checks, calls) is operations.h's table.
//
// Adding an operation: its value here, in kAllOperations, name() and bus_factor(); then operations.h's steps.
#pragma once

#include <array>
#include <optional>
#include <string_view>

namespace strata::coll {

enum class Operation { allreduce, allgather, reduce_scatter, alltoall, broadcast, reduce, sendrecv };

// In the order of the enum, as the tables indexed by it (operations.cpp, nccl_calls.cpp) are.
inline constexpr auto kAllOperations = std::to_array<Operation>(
    {Operation::allreduce, Operation::allgather, Operation::reduce_scatter, Operation::alltoall, Operation::broadcast,
     Operation::reduce, Operation::sendrecv});

// "allreduce", "allgather", "reduce_scatter", ...: the names of flags, result columns and system descriptions.
constexpr std::string_view name(Operation operation) {
  switch (operation) {
    case Operation::allreduce: return "allreduce";
    case Operation::allgather: return "allgather";
    case Operation::reduce_scatter: return "reduce_scatter";
    case Operation::alltoall: return "alltoall";
    case Operation::broadcast: return "broadcast";
    case Operation::reduce: return "reduce";
    case Operation::sendrecv: return "sendrecv";
  }
  return "?";
}

constexpr std::optional<Operation> parse_operation(std::string_view text) {
  for (Operation operation : kAllOperations)
    if (name(operation) == text) return operation;
  return std::nullopt;
}

// nccl-tests' busbw / algbw on n ranks (docs/metrics.md): the bytes through each rank's link per byte of the size S.
constexpr double bus_factor(Operation operation, int n) {
  switch (operation) {
    case Operation::allreduce: return 2.0 * (n - 1) / n;
    case Operation::allgather:
    case Operation::reduce_scatter:
    case Operation::alltoall: return double(n - 1) / n;
    case Operation::broadcast:
    case Operation::reduce:
    case Operation::sendrecv: return 1.0;
  }
  return 1.0;
}

}  // namespace strata::coll
