// libFuzzer target: Kineto (PyTorch profiler) trace import. The input is split into per-rank
// files at "\n#RANK#\n". The importer must return an ImportedTrace or throw TraceError:
// anything else (another exception, a crash, a hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "traces/kineto.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  std::string_view data(reinterpret_cast<const char*>(bytes), size);
  constexpr std::string_view kRank = "\n#RANK#\n";
  std::vector<stratasim::traces::KinetoFile> files;
  while (files.size() < 16) {
    const auto at = data.find(kRank);
    files.push_back(
        {"rank" + std::to_string(files.size()) + ".json", std::string(data.substr(0, at))});
    if (at == std::string_view::npos) break;
    data.remove_prefix(at + kRank.size());
  }
  try {
    (void)stratasim::traces::import_kineto_texts(files);
  } catch (const stratasim::traces::TraceError&) {
  }
  return 0;
}
