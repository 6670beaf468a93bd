// libFuzzer target: DeepSpeed config JSON (strategies/foreign_inputs.hpp), read and applied to a
// small experiment. Only a result or config::ConfigError may come out.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "foreign_inputs_fuzz.hpp"
#include "strategies/foreign_inputs.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(bytes), size);
  try {
    const auto input = stratasim::strategies::deepspeed_from_text(text, "ds_config.json");
    stratasim::fuzz::apply(input.overrides);
  } catch (const stratasim::config::ConfigError&) {
  }
  return 0;
}
