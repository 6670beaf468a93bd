// Placeholder until the importer lands (issue 7, in progress).
#include "traces/kineto.hpp"

namespace stratasim::traces {

ImportedTrace import_kineto(const std::filesystem::path& path) {
  throw TraceError(path.string(), "", "the kineto importer is not built yet");
}

}  // namespace stratasim::traces
