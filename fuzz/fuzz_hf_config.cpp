// libFuzzer target: a Hugging Face config.json read as a model (strategies/foreign_inputs.hpp),
// alone and as the model of a small experiment. Only a result or config::ConfigError may come
// out.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string_view>
#include <vector>

#include "foreign_inputs_fuzz.hpp"
#include "hw_models/json_depth.hpp"
#include "strategies/foreign_inputs.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(bytes), size);
  std::vector<std::string> notes;
  try {
    (void)stratasim::strategies::hf_model_from_text(text, "config.json", notes);
  } catch (const stratasim::config::ConfigError&) {
  }
  // As stratasim reads a model file: nested no deeper than config::kMaxJsonDepth (copying a
  // deeper value overflows the stack), else rejected at parse.
  nlohmann::json json;
  try {
    json = stratasim::config::parse_json_depth_bounded(text, "config.json");
  } catch (const std::exception&) {  // too deep (ConfigError) or not JSON (parse_error)
    return 0;
  }
  stratasim::fuzz::apply({}, json);
  return 0;
}
