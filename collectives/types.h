// Element types and reduction operations of the collective benchmarks, named as nccl-tests names them so
// results line up with NCCL runs. Strata reduces on the host itself (its own algorithms) and hands the same
// types to MPI (the library path), so both views live here.
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace strata::coll {

// float16 and bfloat16 are stored as their 16 raw bits (uint16_t) and computed in float.
enum class DataType { int8, int32, float32, float64, float16, bfloat16 };
enum class RedOp { sum, prod, min, max, avg };

inline constexpr std::array<DataType, 6> kAllDataTypes{DataType::int8,    DataType::int32,   DataType::float32,
                                                       DataType::float64, DataType::float16, DataType::bfloat16};
inline constexpr std::array<RedOp, 5> kAllRedOps{RedOp::sum, RedOp::prod, RedOp::min, RedOp::max, RedOp::avg};

std::string_view name(DataType dtype);  // "int8", "int32", "float", "double", "half", "bfloat16"
std::string_view name(RedOp op);        // "sum", "prod", "min", "max", "avg"
std::size_t size_of(DataType dtype);    // bytes per element
std::optional<DataType> parse_datatype(std::string_view text);
std::optional<RedOp> parse_redop(std::string_view text);

// Conversions round to nearest, ties to even; NaN stays NaN, overflow becomes infinity.
std::uint16_t float_to_half(float value);
float half_to_float(std::uint16_t bits);
std::uint16_t float_to_bfloat16(float value);
float bfloat16_to_float(std::uint16_t bits);

// Element `index` of a buffer of `dtype`, read or written as a double, so fill and check code needs no
// switch on the type. Storing converts like a C++ cast (integers truncate and must be in range).
void store_value(void* buf, std::size_t index, DataType dtype, double value);
double load_value(const void* buf, std::size_t index, DataType dtype);

// dst[i] = dst[i] op src[i]. Integer sum and prod wrap around like NCCL's. avg reduces as sum: divide once
// at the end with finish_avg, since an average of partial averages is not the average.
void reduce_into(void* dst, const void* src, std::size_t count, DataType dtype, RedOp op);
// buf[i] /= rank_count; integers divide with C++ truncation, as NCCL does.
void finish_avg(void* buf, std::size_t count, DataType dtype, int rank_count);
// out[i] = in_0[i] op in_1[i] op ... op in_last[i] into every output, the inputs taken in order exactly as
// successive reduce_into calls would (bit for bit), then divided by average_over as finish_avg does where it is
// positive: a reduction into several places in one pass, each input element read once and each result written
// from registers. One input copies it. `stream`: write with non-temporal stores, for outputs that will not be
// read soon (those 16-byte aligned; an output that is also an input is written through the cache); another
// core sees them only after a store fence (_mm_sfence).
void reduce_into_all(std::span<std::byte* const> outputs, std::span<const std::byte* const> inputs, std::size_t count,
                     DataType dtype, RedOp op, int average_over, bool stream);

// The datatypes and reductions MPI has built in: MPI_DATATYPE_NULL for the 16-bit floats, MPI_OP_NULL for avg
// (MpiTypes covers those). Inline, for the library's blocking fast path (process_group.h).
inline MPI_Datatype native_mpi_datatype(DataType dtype) {
  switch (dtype) {
    case DataType::int8: return MPI_INT8_T;
    case DataType::int32: return MPI_INT32_T;
    case DataType::float32: return MPI_FLOAT;
    case DataType::float64: return MPI_DOUBLE;
    case DataType::float16:
    case DataType::bfloat16: return MPI_DATATYPE_NULL;
  }
  return MPI_DATATYPE_NULL;
}
inline MPI_Op native_mpi_op(RedOp op) {
  switch (op) {
    case RedOp::sum: return MPI_SUM;
    case RedOp::prod: return MPI_PROD;
    case RedOp::min: return MPI_MIN;
    case RedOp::max: return MPI_MAX;
    case RedOp::avg: return MPI_OP_NULL;
  }
  return MPI_OP_NULL;
}

// The MPI datatypes and ops for every (dtype, op), for the MPI library path. MPI has no 16-bit floats, so
// half and bfloat16 travel as a 2-byte contiguous type with user-defined (commutative) ops built on
// reduce_into. Construct after MPI_Init and destroy before MPI_Finalize: it frees what it created.
class MpiTypes {
 public:
  MpiTypes();
  ~MpiTypes();
  MpiTypes(const MpiTypes&) = delete;
  MpiTypes& operator=(const MpiTypes&) = delete;

  MPI_Datatype datatype(DataType dtype) const;
  // MPI has no average: avg gives the sum op, and the caller applies finish_avg to the result.
  MPI_Op op(DataType dtype, RedOp op) const;

 private:
  static constexpr int kUserOpCount = 4;  // sum, prod, min, max
  MPI_Datatype two_byte_type_ = MPI_DATATYPE_NULL;
  std::array<MPI_Op, kUserOpCount> half_ops_{};
  std::array<MPI_Op, kUserOpCount> bfloat16_ops_{};
};

}  // namespace strata::coll
