// libFuzzer target: a device profile fitted from a Kineto trace (stratasim calibrate
// --from-trace). The fit must return a TraceCalibration or throw TraceError: anything else
// (another exception, a crash, a hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "hw_models/device.hpp"
#include "traces/import.hpp"
#include "traces/kineto_profile.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  static const stratasim::hw::DeviceSpec device = [] {
    stratasim::hw::DeviceSpec d;
    d.name = "fuzz-gpu";
    for (auto& peak : d.peak_flops) peak = stratasim::FlopRate(1e15);
    d.memory_bandwidth = stratasim::Bandwidth(3e12);
    return d;
  }();
  try {
    (void)stratasim::traces::calibrate_from_kineto_text(
        "trace.json", std::string(reinterpret_cast<const char*>(bytes), size), device);
  } catch (const stratasim::traces::TraceError&) {
  }
  return 0;
}
