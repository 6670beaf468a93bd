// PyTorch profiler / Kineto Chrome-trace JSON in: import as a Program.
#pragma once

#include <filesystem>

#include "traces/import.hpp"

namespace stratasim::traces {

/// Imports Kineto traces: one JSON file per rank (a folder of them, or one file for a single
/// rank). Throws TraceError.
ImportedTrace import_kineto(const std::filesystem::path& path);

}  // namespace stratasim::traces
