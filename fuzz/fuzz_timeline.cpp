// libFuzzer target: stratasim's timeline.json importer must turn any bytes into a Program or a
// TraceError, never a crash, a hang or a sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "traces/import.hpp"
#include "traces/timeline_import.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto trace = stratasim::traces::import_timeline_text(
        std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.json");
    (void)trace;
  } catch (const stratasim::traces::TraceError&) {
    // Expected for malformed input.
  }
  return 0;
}
