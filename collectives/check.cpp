// Implementation of the collective checks and conventions (see check.h).
#include "collectives/check.h"

#include <algorithm>
#include <cmath>

namespace strata::coll {

bool is_integer(DataType d) { return d == DataType::int8 || d == DataType::int32; }

bool is_reduction(Operation op) {
  return op == Operation::allreduce || op == Operation::reduce_scatter || op == Operation::reduce;
}

double bus_factor(Operation op, int n) {
  switch (op) {
    case Operation::allreduce: return 2.0 * (n - 1) / n;
    case Operation::allgather: case Operation::reduce_scatter: case Operation::alltoall: return double(n - 1) / n;
    default: return 1.0;
  }
}


Counts counts_for(Operation op, size_t bytes, size_t elem, int n) {
  Counts c;
  size_t total = bytes / elem;
  switch (op) {
    case Operation::allgather:
      c.count = total / n, c.send_elems = c.count, c.recv_elems = c.count * n;
      c.size_bytes = c.recv_elems * elem, c.bytes_per_rank = c.count * elem;
      break;
    case Operation::reduce_scatter:
      c.count = total / n, c.send_elems = c.count * n, c.recv_elems = c.count;
      c.size_bytes = c.send_elems * elem, c.bytes_per_rank = c.count * elem;
      break;
    case Operation::alltoall:
      c.count = total / n, c.send_elems = c.count * n, c.recv_elems = c.count * n;
      c.size_bytes = c.send_elems * elem, c.bytes_per_rank = c.size_bytes;
      break;
    default:
      c.count = total, c.send_elems = total, c.recv_elems = total;
      c.size_bytes = total * elem, c.bytes_per_rank = c.size_bytes;
  }
  return c;
}

// Small integers (|x| <= 48; sums of |x| <= 4 over up to 64 ranks stay inside bfloat16's exact integers),
// and +-1 (with one 2) for products, so every dtype holds the exact result.
double check_input(Operation op, RedOp redop, int rank, size_t i) {
  if (is_reduction(op)) {
    if (redop == RedOp::prod) return ((rank + i) % 3 == 0 ? -1.0 : 1.0) * (rank == 0 && i % 5 == 0 ? 2.0 : 1.0);
    return static_cast<double>(static_cast<long>((rank * 7 + i * 13) % 9) - 4);
  }
  return static_cast<double>(static_cast<long>((rank * 31 + i * 7) % 97) - 48);
}

double expected_reduction(RedOp redop, DataType dtype, int n, size_t i, Operation op) {
  double acc = check_input(op, redop, 0, i);
  for (int r = 1; r < n; ++r) {
    double v = check_input(op, redop, r, i);
    switch (redop) {
      case RedOp::sum: case RedOp::avg: acc += v; break;
      case RedOp::prod: acc *= v; break;
      case RedOp::min: acc = std::min(acc, v); break;
      case RedOp::max: acc = std::max(acc, v); break;
    }
  }
  if (redop == RedOp::avg) acc = is_integer(dtype) ? std::trunc(acc / n) : acc / n;
  if (dtype == DataType::int8) acc = static_cast<double>(static_cast<int8_t>(static_cast<int64_t>(acc)));
  return acc;
}

bool matches(double got, double expected, DataType dtype, RedOp redop) {
  if (redop != RedOp::avg || is_integer(dtype)) {
    unsigned char stored[8];
    store_value(stored, 0, dtype, expected);
    return got == load_value(stored, 0, dtype);
  }
  // An average is rounded twice (sum, then division) in 16-bit types: allow one unit in the last place.
  double ulp = dtype == DataType::float16 ? 0x1p-10 : dtype == DataType::bfloat16 ? 0x1p-7
             : dtype == DataType::float32 ? 0x1p-23 : 0x1p-52;
  return std::fabs(got - expected) <= ulp * std::max(1.0, std::fabs(expected));
}

std::vector<unsigned char> check_inputs(const CheckSpec& c, const Counts& n, int rank) {
  const size_t elem = size_of(c.dtype);
  std::vector<unsigned char> host(n.send_elems * elem);
  for (size_t i = 0; i < n.send_elems; ++i)
    store_value(host.data(), i, c.dtype, check_input(c.op, c.redop, rank, i));
  return host;
}

int64_t count_wrong(const CheckSpec& c, const Counts& n, const std::vector<unsigned char>& out, int rank, int size,
                    int root) {
  int64_t wrong = 0;
  auto expect = [&](size_t index, double value) {
    double got = load_value(out.data(), index, c.dtype);
    if (!matches(got, value, c.dtype, c.redop)) ++wrong;
  };
  switch (c.op) {
    case Operation::allreduce:
      for (size_t i = 0; i < n.count; ++i) expect(i, expected_reduction(c.redop, c.dtype, size, i, c.op));
      break;
    case Operation::reduce:
      if (rank == root)
        for (size_t i = 0; i < n.count; ++i) expect(i, expected_reduction(c.redop, c.dtype, size, i, c.op));
      break;
    case Operation::reduce_scatter:
      for (size_t i = 0; i < n.count; ++i)
        expect(i, expected_reduction(c.redop, c.dtype, size, static_cast<size_t>(rank) * n.count + i, c.op));
      break;
    case Operation::allgather:
      for (int r = 0; r < size; ++r)
        for (size_t i = 0; i < n.count; ++i) expect(r * n.count + i, check_input(c.op, c.redop, r, i));
      break;
    case Operation::alltoall:
      for (int s = 0; s < size; ++s)
        for (size_t i = 0; i < n.count; ++i)
          expect(s * n.count + i, check_input(c.op, c.redop, s, static_cast<size_t>(rank) * n.count + i));
      break;
    case Operation::broadcast:
      for (size_t i = 0; i < n.count; ++i) expect(i, check_input(c.op, c.redop, root, i));
      break;
    case Operation::sendrecv:
      for (size_t i = 0; i < n.count; ++i) expect(i, check_input(c.op, c.redop, (rank - 1 + size) % size, i));
      break;
  }
  return wrong;
}


}  // namespace strata::coll
