// The GPU tests' own main: without a GPU it prints why and returns 77, which ctest reports as
// skipped (SKIP_RETURN_CODE 77), not failed; with one it runs doctest.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "exec/devices.hpp"

int main(int argc, char** argv) {
  if (stratasim::exec::visible_gpus() == 0) {
    std::printf("no GPU: skipped (%s)\n", stratasim::exec::cuda_description().c_str());
    return 77;
  }
  std::printf("%s\n", stratasim::exec::cuda_description().c_str());
  doctest::Context context(argc, argv);
  return context.run();
}
