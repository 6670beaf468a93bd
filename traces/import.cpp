// Placeholder until the dispatcher lands (issue 7, in progress).
#include "traces/import.hpp"

namespace stratasim::traces {

TraceError::TraceError(std::string file, std::string where, std::string message)
    : std::runtime_error(file + (where.empty() ? "" : ": " + where) + ": " + message),
      file_(std::move(file)),
      where_(std::move(where)),
      message_(std::move(message)) {}

}  // namespace stratasim::traces
