// Strata's element types and reductions as NCCL names them (NCCL target only: needs nccl.h).
#pragma once

#include <nccl.h>

#include <stdexcept>

#include "collectives/types.h"

namespace strata::coll {

inline ncclDataType_t nccl_type(DataType dtype) {
  switch (dtype) {
    case DataType::int8: return ncclInt8;
    case DataType::int32: return ncclInt32;
    case DataType::float32: return ncclFloat32;
    case DataType::float64: return ncclFloat64;
    case DataType::float16: return ncclFloat16;
    case DataType::bfloat16: return ncclBfloat16;
  }
  throw std::invalid_argument("datatype not available in NCCL");
}

inline ncclRedOp_t nccl_op(RedOp op) {
  switch (op) {
    case RedOp::sum: return ncclSum;
    case RedOp::prod: return ncclProd;
    case RedOp::min: return ncclMin;
    case RedOp::max: return ncclMax;
    case RedOp::avg: return ncclAvg;
  }
  throw std::invalid_argument("reduction not available in NCCL");
}

}  // namespace strata::coll
