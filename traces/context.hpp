// A report's context built from an experiment: figures the report cannot get from the
// Program and Timeline (batch, tokens, peak rate, capacity, stages) and the setup lines of the
// summary. Used by the CLI, the benchmarks and the tests alike.
#pragma once

#include <cstdint>
#include <string>

#include "strategies/experiment.hpp"
#include "traces/report.hpp"

namespace stratasim::traces {

ReportContext report_context(const strategies::Experiment& experiment);

/// 1234567 -> "1,234,567".
std::string with_commas(std::int64_t v);
/// Parameters in billions: 174.6 B, 6.74 B.
std::string billions(std::int64_t params);

}  // namespace stratasim::traces
