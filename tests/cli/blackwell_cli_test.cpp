// The GB200 NVL72 example from the command line: bad input about its cluster exits 2 naming the
// key (a node larger than the intra fabric's NVLink domain, a device file that does not exist).
#include <doctest/doctest.h>

#include "cli/helpers.hpp"

using namespace stratasim::testing::cli;

TEST_CASE("cli: an NVL72 node beyond its 72-GPU NVLink domain, or an unknown device, exits 2") {
  const TempDir tmp("cli-blackwell");
  // 144 GPUs in one node: the nvlink5-nvl72 fabric's domain holds 72.
  check_bad_input("simulate gpt-gb200-nvl72 --set cluster.devices_per_node=144",
                  {"devices_per_node", "at most 72", "nvlink5-nvl72"});
  // A device file that is not there.
  check_bad_input(
      "simulate gpt-gb200-nvl72 --set cluster.device=" + (tmp.path() / "gb400.json").string(),
      {"device", "gb400.json"});
}
