// PyTorch profiler / Kineto Chrome-trace JSON in: import as a Program.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "traces/import.hpp"

namespace stratasim::traces {

/// Imports Kineto traces: one JSON file per rank (a folder of them, or one file for a single
/// rank). Throws TraceError.
ImportedTrace import_kineto(const std::filesystem::path& path);

/// A Kineto trace file in memory: its name (for messages, and the rank when the file does not
/// say) and its text.
struct KinetoFile {
  std::string name;
  std::string text;
};

/// The same from texts in memory (the fuzz target's entry point). Each file's rank is its
/// "distributedInfo": {"rank"}, else a number after "rank" in its name, else (one file) 0.
/// Throws TraceError only.
ImportedTrace import_kineto_texts(const std::vector<KinetoFile>& files);

}  // namespace stratasim::traces
