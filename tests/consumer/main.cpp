// Out-of-tree consumer: uses only installed headers and the shared library.
#include <cstdio>
#include <stdexcept>

#include "meshmuon/bf16.h"
#include "meshmuon/blas.h"
#include "meshmuon/tensor.h"

int main() {
  float x = 1.00390625f;  // halfway between two bf16 values: ties to even
  if (meshmuon::float_to_bf16(x).bits != 0x3F80) return 1;
  meshmuon::Shape s{3, 4};
  if (s.numel() != 12) return 1;
  try {
    meshmuon::parse_dtype("int8");
    return 1;
  } catch (const std::invalid_argument&) {
  }
  const meshmuon::BlasInfo info = meshmuon::blas_info();
  std::printf("consumer ok: BLAS %s core %s\n", info.library.c_str(), info.corename.c_str());
  return info.coretype_ok ? 0 : 3;
}
