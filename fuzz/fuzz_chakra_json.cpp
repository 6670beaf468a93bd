// libFuzzer target: Chakra ET import, JSON form (what Chakra's jsonizer writes). The input is
// split into rank files at "\n#RANK#\n"; a part starting "#GROUPS#" is the comm-group file. The
// importer must return an ImportedTrace or throw TraceError: anything else (another exception, a
// crash, a hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "traces/chakra.hpp"

namespace {

void split(std::string_view data, std::vector<std::string>& ranks,
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

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  std::vector<std::string> ranks;
  std::optional<std::string> groups;
  split(std::string_view(reinterpret_cast<const char*>(bytes), size), ranks, groups);
  try {
    (void)stratasim::traces::import_chakra_buffers(ranks, groups, "fuzz", true);
  } catch (const stratasim::traces::TraceError&) {
  }
  return 0;
}
