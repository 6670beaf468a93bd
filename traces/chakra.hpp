// MLCommons Chakra execution traces (ET) in and out: import as a Program, export any Program.
#pragma once

#include <filesystem>

#include "traces/import.hpp"

namespace stratasim::traces {

/// Imports a Chakra trace: a folder or a prefix whose per-rank files are "<prefix>.<rank>.et"
/// (protobuf) or "<prefix>.<rank>.json" (Chakra's JSON form). Throws TraceError.
ImportedTrace import_chakra(const std::filesystem::path& path);

}  // namespace stratasim::traces
