// Element types, 16-bit float conversions and host-side reductions for the collective benchmarks, plus the
// MPI datatypes and ops that let the MPI library reduce the same types.
#include "collectives/types.h"

#include <stdexcept>
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "collectives/mpi_error.h"

namespace strata::coll {

namespace {

struct TypeInfo {
  DataType dtype;
  std::string_view name;
  std::size_t size;
};

constexpr std::array<TypeInfo, 6> kTypeInfo{{{DataType::int8, "int8", 1},
                                             {DataType::int32, "int32", 4},
                                             {DataType::float32, "float", 4},
                                             {DataType::float64, "double", 8},
                                             {DataType::float16, "half", 2},
                                             {DataType::bfloat16, "bfloat16", 2}}};

constexpr std::array<std::string_view, 5> kRedOpNames{"sum", "prod", "min", "max", "avg"};

const TypeInfo& info(DataType dtype) { return kTypeInfo.at(static_cast<std::size_t>(dtype)); }

// How a stored element becomes a value to compute with, and back. Native types compute as themselves; the
// 16-bit floats compute in float and round once per operation, as GPUs do.
template <typename T>
struct NativeCodec {
  using Stored = T;
  static T decode(T v) { return v; }
  static T encode(T v) { return v; }
};
struct HalfCodec {
  using Stored = std::uint16_t;
  static float decode(std::uint16_t v) { return half_to_float(v); }
  static std::uint16_t encode(float v) { return float_to_half(v); }
};
struct Bfloat16Codec {
  using Stored = std::uint16_t;
  static float decode(std::uint16_t v) { return bfloat16_to_float(v); }
  static std::uint16_t encode(float v) { return float_to_bfloat16(v); }
};

// Signed overflow is undefined in C++, so integers add and multiply as unsigned, which wraps as NCCL does.
template <typename T>
T add(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <typename T>
T multiply(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

template <typename Codec, typename Combine>
void combine(void* dst, const void* src, std::size_t count, Combine fn) {
  using Stored = typename Codec::Stored;
  auto* d = static_cast<Stored*>(dst);
  const auto* s = static_cast<const Stored*>(src);
  for (std::size_t i = 0; i < count; ++i) d[i] = Codec::encode(fn(Codec::decode(d[i]), Codec::decode(s[i])));
}

// Calls with_fn with the element function of op.
template <typename Codec, typename WithFn>
void with_op(RedOp op, WithFn&& with_fn) {
  using Value = decltype(Codec::decode(typename Codec::Stored{}));
  switch (op) {
    case RedOp::sum:
    case RedOp::avg: return with_fn([](Value a, Value b) { return add(a, b); });
    case RedOp::prod: return with_fn([](Value a, Value b) { return multiply(a, b); });
    case RedOp::min: return with_fn([](Value a, Value b) { return b < a ? b : a; });
    case RedOp::max: return with_fn([](Value a, Value b) { return a < b ? b : a; });
  }
}

template <typename Codec>
void reduce_with(void* dst, const void* src, std::size_t count, RedOp op) {
  with_op<Codec>(op, [&](auto fn) { combine<Codec>(dst, src, count, fn); });
}

template <typename Codec>
typename Codec::Stored divided(typename Codec::Stored v, int divisor) {
  using Value = decltype(Codec::decode(typename Codec::Stored{}));
  // Integers divide in a wide type: the rank count need not fit in the element type (int8 and 200 ranks).
  if constexpr (std::is_integral_v<Value>)
    return static_cast<Value>(static_cast<long long>(v) / divisor);
  else
    return Codec::encode(Codec::decode(v) / static_cast<Value>(divisor));
}

template <typename Codec>
void divide_all(void* buf, std::size_t count, int divisor) {
  auto* b = static_cast<typename Codec::Stored*>(buf);
  for (std::size_t i = 0; i < count; ++i) b[i] = divided<Codec>(b[i], divisor);
}

// Writes 64 bytes to an output; streamed ones bypass the cache (16-byte aligned outputs only).
void store_line(std::byte* dst, const std::byte* line, bool stream) {
#if defined(__SSE2__)
  if (stream) {
    for (int q = 0; q < 4; ++q)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + 16 * q),
                       _mm_load_si128(reinterpret_cast<const __m128i*>(line + 16 * q)));
    return;
  }
#endif
  std::memcpy(dst, line, 64);
}

// reduce_into_all, one codec: 64 bytes of elements at a time, the partial result in registers (the fixed-size
// inner loops vectorise), each input read once, the result stored to every output.
template <typename Codec, typename Fn>
void reduce_lines(std::span<std::byte* const> outputs, std::span<const std::byte* const> inputs, std::size_t count,
                  Fn fn, int average_over, bool stream) {
  using Stored = typename Codec::Stored;
  constexpr std::size_t kLine = 64 / sizeof(Stored);
  // An output that is also an input is in the cache already, just read: it takes plain stores.
  std::vector<char> streamed(outputs.size());
  for (std::size_t k = 0; k < outputs.size(); ++k)
    streamed[k] = stream && reinterpret_cast<std::uintptr_t>(outputs[k]) % 16 == 0 &&
                  std::find(inputs.begin(), inputs.end(), outputs[k]) == inputs.end();
  auto reduce = [&](std::size_t i, std::size_t elems, Stored* acc) {
    std::memcpy(acc, inputs[0] + i * sizeof(Stored), elems * sizeof(Stored));
    for (std::size_t r = 1; r < inputs.size(); ++r) {
      Stored in[kLine]{};
      std::memcpy(in, inputs[r] + i * sizeof(Stored), elems * sizeof(Stored));
      for (std::size_t j = 0; j < kLine; ++j) acc[j] = Codec::encode(fn(Codec::decode(acc[j]), Codec::decode(in[j])));
    }
    if (average_over > 0)
      for (std::size_t j = 0; j < kLine; ++j) acc[j] = divided<Codec>(acc[j], average_over);
  };
  std::size_t i = 0;
  for (; i + kLine <= count; i += kLine) {
    alignas(64) Stored acc[kLine];
    reduce(i, kLine, acc);
    for (std::size_t k = 0; k < outputs.size(); ++k)
      store_line(outputs[k] + i * sizeof(Stored), reinterpret_cast<const std::byte*>(acc), streamed[k] != 0);
  }
  if (i < count) {  // the last partial line, padded (the padding is reduced too, and not stored)
    alignas(64) Stored acc[kLine]{};
    reduce(i, count - i, acc);
    for (std::byte* out : outputs) std::memcpy(out + i * sizeof(Stored), acc, (count - i) * sizeof(Stored));
  }
}

// Calls fn with the codec of dtype, so every per-type routine is written once.
template <typename Fn>
void with_codec(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::int8: return fn(NativeCodec<std::int8_t>{});
    case DataType::int32: return fn(NativeCodec<std::int32_t>{});
    case DataType::float32: return fn(NativeCodec<float>{});
    case DataType::float64: return fn(NativeCodec<double>{});
    case DataType::float16: return fn(HalfCodec{});
    case DataType::bfloat16: return fn(Bfloat16Codec{});
  }
}

// MPI user functions carry no context, so each (type, op) pair gets its own instantiation.
template <DataType D, RedOp O>
void mpi_user_reduce(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  reduce_into(inout, in, static_cast<std::size_t>(*len), D, O);
}

template <DataType D>
std::array<MPI_Op, 4> create_user_ops() {
  std::array<MPI_Op, 4> ops{};
  STRATA_MPI_CHECK(MPI_Op_create(&mpi_user_reduce<D, RedOp::sum>, 1, &ops[0]));
  STRATA_MPI_CHECK(MPI_Op_create(&mpi_user_reduce<D, RedOp::prod>, 1, &ops[1]));
  STRATA_MPI_CHECK(MPI_Op_create(&mpi_user_reduce<D, RedOp::min>, 1, &ops[2]));
  STRATA_MPI_CHECK(MPI_Op_create(&mpi_user_reduce<D, RedOp::max>, 1, &ops[3]));
  return ops;
}

std::size_t user_op_slot(RedOp op) {
  switch (op) {
    case RedOp::sum:
    case RedOp::avg: return 0;
    case RedOp::prod: return 1;
    case RedOp::min: return 2;
    case RedOp::max: return 3;
  }
  return 0;
}

}  // namespace

std::string_view name(DataType dtype) { return info(dtype).name; }
std::string_view name(RedOp op) { return kRedOpNames.at(static_cast<std::size_t>(op)); }
std::size_t size_of(DataType dtype) { return info(dtype).size; }

std::optional<DataType> parse_datatype(std::string_view text) {
  for (const TypeInfo& t : kTypeInfo)
    if (t.name == text) return t.dtype;
  return std::nullopt;
}

std::optional<RedOp> parse_redop(std::string_view text) {
  for (RedOp op : kAllRedOps)
    if (name(op) == text) return op;
  return std::nullopt;
}

// Bit manipulation after F. Giesen's float_to_half_fast3_rtne: the hardware's own float rounding does the
// subnormal case, and an odd-mantissa bias gives ties-to-even for normal numbers.
std::uint16_t float_to_half(float value) {
  constexpr std::uint32_t kFloatInfinity = 255u << 23;
  constexpr std::uint32_t kHalfOverflow = (127u + 16u) << 23;  // 2^16: everything from here is inf or NaN
  constexpr std::uint32_t kSmallestHalfNormal = 113u << 23;    // 2^-14
  const float denorm_magic = std::bit_cast<float>(((127u - 15u) + (23u - 10u) + 1u) << 23);

  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  std::uint32_t half = 0;
  if (bits >= kHalfOverflow) {
    half = bits > kFloatInfinity ? 0x7e00u : 0x7c00u;
  } else if (bits < kSmallestHalfNormal) {
    // Adding the magic number makes the FPU round away the bits a half subnormal cannot hold.
    const float shifted = std::bit_cast<float>(bits) + denorm_magic;
    half = std::bit_cast<std::uint32_t>(shifted) - std::bit_cast<std::uint32_t>(denorm_magic);
  } else {
    const std::uint32_t mantissa_odd = (bits >> 13) & 1u;
    bits += (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;
    half = bits >> 13;
  }
  return static_cast<std::uint16_t>(half | (sign >> 16));
}

float half_to_float(std::uint16_t half) {
  constexpr std::uint32_t kShiftedExponent = 0x7c00u << 13;
  const float magic = std::bit_cast<float>(113u << 23);

  std::uint32_t bits = (static_cast<std::uint32_t>(half) & 0x7fffu) << 13;
  const std::uint32_t exponent = bits & kShiftedExponent;
  bits += (127u - 15u) << 23;
  float result = 0;
  if (exponent == kShiftedExponent) {
    result = std::bit_cast<float>(bits + ((128u - 16u) << 23));  // infinity or NaN
  } else if (exponent == 0) {
    result = std::bit_cast<float>(bits + (1u << 23)) - magic;  // zero or subnormal: let the FPU normalise
  } else {
    result = std::bit_cast<float>(bits);
  }
  const std::uint32_t sign = (static_cast<std::uint32_t>(half) & 0x8000u) << 16;
  return std::bit_cast<float>(std::bit_cast<std::uint32_t>(result) | sign);
}

std::uint16_t float_to_bfloat16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  const std::uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding_bias) >> 16);
}

float bfloat16_to_float(std::uint16_t bits) { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }

void store_value(void* buf, std::size_t index, DataType dtype, double value) {
  with_codec(dtype, [&](auto codec) {
    using Codec = decltype(codec);
    using Value = decltype(Codec::decode(typename Codec::Stored{}));
    static_cast<typename Codec::Stored*>(buf)[index] = Codec::encode(static_cast<Value>(value));
  });
}

double load_value(const void* buf, std::size_t index, DataType dtype) {
  double value = 0;
  with_codec(dtype, [&](auto codec) {
    using Codec = decltype(codec);
    value = static_cast<double>(Codec::decode(static_cast<const typename Codec::Stored*>(buf)[index]));
  });
  return value;
}

void reduce_into(void* dst, const void* src, std::size_t count, DataType dtype, RedOp op) {
  with_codec(dtype, [&](auto codec) { reduce_with<decltype(codec)>(dst, src, count, op); });
}

void finish_avg(void* buf, std::size_t count, DataType dtype, int rank_count) {
  with_codec(dtype, [&](auto codec) { divide_all<decltype(codec)>(buf, count, rank_count); });
}

void reduce_into_all(std::span<std::byte* const> outputs, std::span<const std::byte* const> inputs, std::size_t count,
                     DataType dtype, RedOp op, int average_over, bool stream) {
  if (inputs.empty() || count == 0) return;
  with_codec(dtype, [&](auto codec) {
    using Codec = decltype(codec);
    with_op<Codec>(op, [&](auto fn) { reduce_lines<Codec>(outputs, inputs, count, fn, average_over, stream); });
  });
}

MpiTypes::MpiTypes() {
  STRATA_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &two_byte_type_));
  STRATA_MPI_CHECK(MPI_Type_commit(&two_byte_type_));
  half_ops_ = create_user_ops<DataType::float16>();
  bfloat16_ops_ = create_user_ops<DataType::bfloat16>();
}

// Destructors must not throw, and after MPI_Finalize nothing may be freed, so failures are ignored here.
MpiTypes::~MpiTypes() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Op& op : half_ops_) MPI_Op_free(&op);
  for (MPI_Op& op : bfloat16_ops_) MPI_Op_free(&op);
  MPI_Type_free(&two_byte_type_);
}

MPI_Datatype MpiTypes::datatype(DataType dtype) const {
  return dtype == DataType::float16 || dtype == DataType::bfloat16 ? two_byte_type_ : native_mpi_datatype(dtype);
}

MPI_Op MpiTypes::op(DataType dtype, RedOp op) const {
  if (dtype == DataType::float16) return half_ops_[user_op_slot(op)];
  if (dtype == DataType::bfloat16) return bfloat16_ops_[user_op_slot(op)];
  return native_mpi_op(op == RedOp::avg ? RedOp::sum : op);
}

}  // namespace strata::coll
