// Numeric formats of tensors and of the peak rates that devices quote for them.
//
// fp8 is any 8-bit float (E4M3 or E5M2: the formats share the tensor cores' FP8 rate); fp4 is
// E2M1 (NVFP4 / MXFP4 elements, Blackwell's FP4 tensor cores), packed two to a byte. The scales
// of block-scaled formats are apart (docs/precision.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace stratasim {

enum class DType : std::uint8_t { fp32, tf32, fp16, bf16, fp8, fp4 };

inline constexpr DType kAllDTypes[] = {DType::fp32, DType::tf32, DType::fp16,
                                       DType::bf16, DType::fp8,  DType::fp4};

/// Bits one element occupies in memory (tf32 is stored as fp32; fp4 is packed).
constexpr std::int64_t bits_of(DType t) {
  switch (t) {
    case DType::fp32:
    case DType::tf32:
      return 32;
    case DType::fp16:
    case DType::bf16:
      return 16;
    case DType::fp8:
      return 8;
    case DType::fp4:
      return 4;
  }
  return 32;
}

/// Bytes one element occupies alone, rounded up to a whole byte (fp4: 1). Sizes of tensors of
/// fp4 elements are packed_bytes().
constexpr std::int64_t size_of(DType t) {
  return (bits_of(t) + 7) / 8;
}

/// Bytes `elements` elements of `t` occupy packed (fp4: two per byte, rounded up).
constexpr std::int64_t packed_bytes(DType t, std::int64_t elements) {
  return (elements * bits_of(t) + 7) / 8;
}

constexpr std::string_view name_of(DType t) {
  switch (t) {
    case DType::fp32:
      return "fp32";
    case DType::tf32:
      return "tf32";
    case DType::fp16:
      return "fp16";
    case DType::bf16:
      return "bf16";
    case DType::fp8:
      return "fp8";
    case DType::fp4:
      return "fp4";
  }
  return "?";
}

constexpr std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : kAllDTypes) {
    if (name_of(t) == name) return t;
  }
  return std::nullopt;
}

}  // namespace stratasim
