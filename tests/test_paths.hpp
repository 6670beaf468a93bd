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
/// ../shared/reference/published.json beside the repository (the project's reference data);
/// in a clone that has no ../shared, the copy in tests/reference/ (a repository test checks
/// that the copy equals the original wherever both are present).
inline std::filesystem::path reference_file() {
  const auto shared = source_dir().parent_path() / "shared" / "reference" / "published.json";
  if (std::filesystem::exists(shared)) return shared;
  return source_dir() / "tests" / "reference" / "published.json";
}

}  // namespace stratasim::testing
