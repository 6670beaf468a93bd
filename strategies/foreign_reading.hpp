// Helpers shared by the readers of foreign inputs (strategies/foreign_inputs.cpp: DeepSpeed,
// Megatron-LM arguments, Hugging Face configs; strategies/fsdp_input.cpp: FSDP configs), so that
// they show values and catch typos of keys the same way. Defined in foreign_inputs.cpp.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "strategies/foreign_inputs.hpp"

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

/// What every reader of one foreign file does the same way: it fails with the file and the key,
/// records an override of the experiment with the key it came from, and keeps notes, all
/// prefixed by `source_` (the file's path, or what stands for it).
class Reader {
 protected:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  /// Throws config::ConfigError(source_, at, message): exit 2, naming the file and `at` (the
  /// JSON path or the argument).
  [[noreturn]] void fail(const std::string& at, const std::string& message) const {
    throw config::ConfigError(source_, at, message);
  }
  /// The experiment's `path` becomes `value`; its origin reads "<source_> (<origin>)".
  void set(const std::string& path, nlohmann::json value, const std::string& origin) {
    out_.overrides.push_back({path, std::move(value), source_ + " (" + origin + ")"});
  }
  void note(const std::string& text) { out_.notes.push_back(source_ + ": " + text); }
  /// A JSON boolean, else fail(at, "expected true or false, got <value>").
  bool boolean(const nlohmann::json& v, const std::string& at) const {
    if (!v.is_boolean()) fail(at, "expected true or false, got " + shown(v));
    return v.get<bool>();
  }

  std::string source_;
  ForeignInput out_;
};

}  // namespace stratasim::strategies::foreign
