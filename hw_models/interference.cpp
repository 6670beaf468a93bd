#include "hw_models/interference.hpp"

#include <algorithm>

namespace stratasim::hw {

void InterferenceSpec::validate() const {
  if (communication_units < 0) {
    throw config::ValidationError("interference.communication_units",
                                  "expected a count of SMs >= 0 (NCCL's channels)");
  }
  if (!(memory_traffic_per_byte >= 0)) {
    throw config::ValidationError("interference.memory_traffic_per_byte",
                                  "expected a factor >= 0 (NCCL: 2 to 3)");
  }
}

InterferenceSpec read_interference(config::ObjectReader reader) {
  InterferenceSpec spec;
  spec.enabled = reader.boolean_or("enabled", spec.enabled);
  spec.communication_units = static_cast<int>(
      reader.integer_in_or("communication_units", 0, 1 << 16, spec.communication_units));
  spec.memory_traffic_per_byte =
      reader.number_or("memory_traffic_per_byte", spec.memory_traffic_per_byte);
  if (!(spec.memory_traffic_per_byte >= 0)) {
    reader.fail("memory_traffic_per_byte", "expected a factor >= 0 (NCCL: 2 to 3)");
  }
  spec.flow_transfers = reader.boolean_or("flow_transfers", spec.flow_transfers);
  reader.finish();
  return spec;
}

double compute_units_rate(int units, int compute_units) {
  const int total = std::max(1, compute_units);
  const int left = std::clamp(total - std::max(0, units), 1, total);
  return static_cast<double>(left) / static_cast<double>(total);
}

double memory_share_rate(Bandwidth demand, Bandwidth memory) {
  const double b = memory.bytes_per_second();
  const double d = std::max(0.0, demand.bytes_per_second());
  if (!(b > 0)) return 1.0;
  return b / (b + d);
}

double compute_rate(const WorkMix& mix, double f_sm, double f_hbm) {
  const double c = std::clamp(mix.compute_bound, 0.0, 1.0);
  const double m = std::clamp(mix.memory_bound, 0.0, 1.0 - c);
  return 1.0 / ((1.0 - c - m) + c / f_sm + m / f_hbm);
}

double transfer_rate(double memory_bound, double f_hbm) {
  const double m = std::clamp(memory_bound, 0.0, 1.0);
  return 1.0 / ((1.0 - m) + m / f_hbm);
}

}  // namespace stratasim::hw
