// Placeholder until the importer lands (issue 7, in progress).
#include "traces/chakra.hpp"

namespace stratasim::traces {

ImportedTrace import_chakra(const std::filesystem::path& path) {
  throw TraceError(path.string(), "", "the chakra importer is not built yet");
}

}  // namespace stratasim::traces
