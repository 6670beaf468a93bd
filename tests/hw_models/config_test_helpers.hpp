// Helpers shared by the config-reading tests of hw_models.
#pragma once

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "hw_models/config_reader.hpp"

namespace stratasim::testing {

/// Writes `text` to `name` in a scratch folder of the temp directory and returns its path.
inline std::filesystem::path write_temp(const std::string& name, const std::string& text,
                                        const std::string& folder = "stratasim-test-config") {
  auto dir = std::filesystem::temp_directory_path() / folder;
  std::filesystem::create_directories(dir);
  auto path = dir / name;
  std::filesystem::create_directories(path.parent_path());  // names like "profiles/p.json"
  std::ofstream(path) << text;
  return path;
}

/// The ConfigError raised by `f`, or a failure if none is.
template <class F>
config::ConfigError error_of(F&& f) {
  try {
    f();
  } catch (const config::ConfigError& e) {
    return e;
  }
  FAIL("expected a ConfigError");
  return config::ConfigError("", "", "");
}

}  // namespace stratasim::testing
