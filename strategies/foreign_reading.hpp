// Helpers shared by the readers of foreign inputs (strategies/foreign_inputs.cpp: DeepSpeed,
// Megatron-LM arguments, Hugging Face configs; strategies/fsdp_input.cpp: FSDP configs), so that
// they show values and catch typos of keys the same way. Defined in foreign_inputs.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace stratasim::strategies::foreign {

/// An unknown key within this many edits (config::edit_distance) of a mapped one is most likely
/// a typo of it, which would silently change what is simulated: the readers make it an error.
inline constexpr std::size_t kTypoDistance = 2;

/// A value as users wrote it (JSON), short and always printable: at most 60 characters (57 and
/// "..." when longer), invalid UTF-8 replaced.
std::string shown(const nlohmann::json& v);

/// The mapped key within kTypoDistance edits of `name` (the first of the closest), or "" when
/// none is, or when `name` is longer than 64 characters (no key is that long).
std::string closest_mapped(std::string_view name, const std::vector<std::string>& mapped);

}  // namespace stratasim::strategies::foreign
