// config_types.hpp — the names of Triton's model-configuration data types (model_config.proto's
// DataType: TYPE_FP32, ...), for backends that write a model's config (python's args
// ["model_config"] without a config.pbtxt, openvino's auto-complete).
#pragma once

#include <string_view>

#include "asyncinfer/tensor.hpp"

namespace asyncinfer::detail {

/// model_config.proto's TYPE_* name of a dtype: "TYPE_FP32", ..., BYTES is "TYPE_STRING".
/// Never blocks; "TYPE_INVALID" for a value outside the enum.
inline std::string_view config_type(DType d) noexcept {
  switch (d) {
    case DType::f32:
      return "TYPE_FP32";
    case DType::f16:
      return "TYPE_FP16";
    case DType::bf16:
      return "TYPE_BF16";
    case DType::f64:
      return "TYPE_FP64";
    case DType::i8:
      return "TYPE_INT8";
    case DType::u8:
      return "TYPE_UINT8";
    case DType::i16:
      return "TYPE_INT16";
    case DType::u16:
      return "TYPE_UINT16";
    case DType::i32:
      return "TYPE_INT32";
    case DType::u32:
      return "TYPE_UINT32";
    case DType::i64:
      return "TYPE_INT64";
    case DType::u64:
      return "TYPE_UINT64";
    case DType::boolean:
      return "TYPE_BOOL";
    case DType::bytes:
      return "TYPE_STRING";
  }
  return "TYPE_INVALID";
}

}  // namespace asyncinfer::detail
