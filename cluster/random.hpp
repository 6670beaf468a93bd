// The cluster simulator's random numbers (cluster/ones.hpp, cluster/workload.hpp) come from the
// project's one generator, strategies/random.hpp (xoshiro256** seeded through splitmix64); its
// policies draw integers with Xoshiro256::below_by_scaling.
#pragma once

#include "strategies/random.hpp"

namespace stratasim::cluster {

using strategies::splitmix64;
using strategies::Xoshiro256;

}  // namespace stratasim::cluster
