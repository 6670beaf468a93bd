// Shared by the Chakra fuzz targets (protobuf and JSON form). The input is split into rank
// files at "\n#RANK#\n"; a part starting "#GROUPS#" is the comm-group file. The importer must
// return an ImportedTrace or throw TraceError: anything else (another exception, a crash, a
// hang) is a bug.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "traces/chakra.hpp"

namespace stratasim::fuzz {

inline void split_chakra_input(std::string_view data, std::vector<std::string>& ranks,
                               std::optional<std::string>& groups) {
  constexpr std::string_view kRank = "\n#RANK#\n";
  constexpr std::string_view kGroups = "#GROUPS#";
  while (true) {
    const auto at = data.find(kRank);
    const std::string_view part = data.substr(0, at);
    if (part.substr(0, kGroups.size()) == kGroups) {
      groups = std::string(part.substr(kGroups.size()));
    } else if (ranks.size() < 16) {
      ranks.emplace_back(part);
    }
    if (at == std::string_view::npos) break;
    data.remove_prefix(at + kRank.size());
  }
}

inline int fuzz_chakra(const std::uint8_t* bytes, std::size_t size, bool json_form) {
  std::vector<std::string> ranks;
  std::optional<std::string> groups;
  split_chakra_input(std::string_view(reinterpret_cast<const char*>(bytes), size), ranks, groups);
  try {
    (void)traces::import_chakra_buffers(ranks, groups, "fuzz", json_form);
  } catch (const traces::TraceError&) {
  }
  return 0;
}

}  // namespace stratasim::fuzz
