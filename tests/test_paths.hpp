// Where tests find the repository's configs and the published reference numbers.
#pragma once

#include <filesystem>

namespace stratasim::testing {

inline std::filesystem::path source_dir() {
  return STRATASIM_SOURCE_DIR;
}
inline std::filesystem::path configs_dir() {
  return source_dir() / "configs";
}
/// ../shared/reference/published.json beside the repository.
inline std::filesystem::path reference_file() {
  return source_dir().parent_path() / "shared" / "reference" / "published.json";
}

}  // namespace stratasim::testing
