// Streaming reads of large JSON documents: a timeline.json of every rank is hundreds of MB, and
// its DOM (nlohmann::json) takes about ten times that in memory. nlohmann::json's SAX parser
// reads the text once, front to back, and only what the reader asks for becomes a json value:
//
// - the root's type;
// - the root object's members named in `keep` (the last occurrence of each, as
//   nlohmann::json::parse keeps it), built as values;
// - the elements of one array, the root object's member `array` or the root itself when the
//   root is an array: each element is built as a value, handed to `on_element` with its index
//   and freed before the next; without `on_element` they are only counted;
// - every other value is skipped without being built.
//
// So the memory a read takes is one element plus the kept members, whatever the text's size.
// Errors are exactly those of nlohmann::json::parse of the same text at the same point: its
// parse_error (with the byte offset) for text that does not parse, its out_of_range for a
// number a double cannot hold; and nesting deeper than config::kMaxJsonDepth throws
// config::ConfigError(source, "", "JSON nested deeper than 512 levels") at the same point that
// config::parse_json_depth_bounded does (hw_models/json_depth.hpp). Exceptions thrown by
// `on_element` pass through and end the read.
#pragma once

#include <cstddef>
#include <functional>
#include <iosfwd>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace stratasim::traces {

/// The text to read: in memory, or a stream read from its current position to its end (a read
/// that needs the text twice seeks the stream back to where the first read began).
using JsonText = std::variant<std::string_view, std::istream*>;

struct JsonStreamRequest {
  /// The root member whose elements stream; they stream too when the root is an array.
  std::string array;
  /// Root members built as values (JsonStreamResult::kept).
  std::vector<std::string> keep;
  /// Called with each element of the array and its index; may move from the element. Empty:
  /// elements are counted, not built.
  std::function<void(std::size_t index, nlohmann::json& element)> on_element;
  /// Which occurrence of `array` in the root object goes to on_element (0: the first). When an
  /// object names a key twice nlohmann::json::parse keeps the last value, so a reader that must
  /// agree reads twice: once to count (JsonStreamResult::array_occurrences), once to stream.
  std::size_t occurrence = 0;
};

struct JsonStreamResult {
  nlohmann::json::value_t root = nlohmann::json::value_t::null;
  /// Times the root object names `array` (0: not a member); the type and element count of its
  /// last occurrence, or of the root when the root is an array.
  std::size_t array_occurrences = 0;
  nlohmann::json::value_t array_type = nlohmann::json::value_t::null;
  std::size_t array_size = 0;
  /// The kept members the root object has.
  std::map<std::string, nlohmann::json> kept;
};

/// Reads `text` once as the request says; `source` names it in the nesting error.
JsonStreamResult stream_json(JsonText text, const JsonStreamRequest& request,
                             const std::string& source);

}  // namespace stratasim::traces
