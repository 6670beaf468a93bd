// Numeric formats of tensors and of the peak rates that devices quote for them.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace stratasim {

enum class DType : std::uint8_t { fp32, tf32, fp16, bf16, fp8 };

inline constexpr DType kAllDTypes[] = {DType::fp32, DType::tf32, DType::fp16, DType::bf16,
                                       DType::fp8};

/// Bytes one element occupies in memory (tf32 is stored as fp32).
constexpr std::int64_t size_of(DType t) {
  switch (t) {
    case DType::fp32:
    case DType::tf32:
      return 4;
    case DType::fp16:
    case DType::bf16:
      return 2;
    case DType::fp8:
      return 1;
  }
  return 4;
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
