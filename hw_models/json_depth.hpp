// JSON text read with a bound on its nesting depth: copying or printing a value is recursive,
// and 60,000 levels overflow the stack (issue 18). Document::load (hw_models/config_reader.hpp)
// reads every config file this way; readers of JSON text it does not read (DeepSpeed and FSDP
// configs, Kineto and Chakra traces) call parse_json_depth_bounded; the streaming reader of
// timelines (traces/json_stream.hpp) applies the same bound itself.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace stratasim::config {

/// The deepest nesting a JSON input may have. Real configs nest fewer than 10 levels.
inline constexpr int kMaxJsonDepth = 512;

/// nlohmann::json::parse of `text`, stopped once it nests deeper than kMaxJsonDepth: then a
/// config::ConfigError(source, "", "JSON nested deeper than 512 levels"); nlohmann's own
/// exceptions (parse_error, out_of_range) otherwise, for the caller to word.
nlohmann::json parse_json_depth_bounded(std::string_view text, const std::string& source);

/// "JSON nested deeper than 512 levels": the message of that ConfigError, which readers that
/// bound the depth themselves (traces/json_stream.hpp, a streaming reader) throw too.
const std::string& json_too_deep_message();

}  // namespace stratasim::config
