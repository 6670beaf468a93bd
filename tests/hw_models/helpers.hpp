// Helpers shared by the config-reading tests of hw_models.
#pragma once

#include <doctest/doctest.h>

#include <string>

#include "hw_models/config_reader.hpp"

namespace stratasim::testing {

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
