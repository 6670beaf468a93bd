// The CUDA device is a plugin (exec/cuda_plugin.hpp): where this build has it, it loads into an
// executable that links stratasim_exec (which exports what the plugin uses); where it has none,
// the CUDA device says so. Neither needs a GPU.
#include <doctest/doctest.h>

#include <string>

#include "exec/devices.hpp"

using namespace stratasim::exec;

TEST_CASE("exec: the CUDA plugin loads where this build has it, else the device says why not") {
  const std::string description = cuda_description();
  CAPTURE(description);
#ifdef STRATASIM_HAVE_CUDA_DEVICE
  CHECK(cuda_available());
  CHECK(description.find("could not be loaded") == std::string::npos);
#else
  CHECK_FALSE(cuda_available());
  CHECK(visible_gpus() == 0);
  CHECK(description.find("has no CUDA device") != std::string::npos);
#endif
}
