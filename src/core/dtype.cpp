// DType names as used in CLI, JSON, Python and logs.
#include "meshmuon/dtype.h"

#include "meshmuon/error.h"

namespace meshmuon {

std::string_view to_string(DType t) { return t == DType::F32 ? "fp32" : "bf16"; }

DType parse_dtype(std::string_view name, std::string_view what) {
  if (name == "fp32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  detail::throw_invalid_argument(detail::concat("[dtype] ", what, " '", name,
                                                "' is not supported; use fp32 or bf16"));
}

}  // namespace meshmuon
