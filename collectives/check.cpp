// Implementation of the collective checks and conventions (see check.h).
#include "collectives/check.h"

#include <algorithm>
#include <cmath>

namespace strata::coll {

bool is_integer(DataType d) { return d == DataType::int8 || d == DataType::int32; }

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
  const OperationInfo& op = info(c.op);
  int64_t wrong = 0;
  for (size_t i = 0; i < n.recv_elems; ++i)
    if (const std::optional<double> want = op.expected(c, n.count, rank, size, root, i))
      if (!matches(load_value(out.data(), i, c.dtype), *want, c.dtype, c.redop)) ++wrong;
  return wrong;
}

}  // namespace strata::coll
