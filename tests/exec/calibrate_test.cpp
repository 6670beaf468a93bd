// Calibration on the host device (always available): the profile it measures is complete,
// positive, written and read back (schema 2), and the cost model fed with it predicts a
// measured shape exactly. The host figures describe naive CPU kernels: only their consistency
// is tested, never their values.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "exec/calibrate.hpp"
#include "exec/host_device.hpp"
#include "hw_models/cluster.hpp"
#include "hw_models/device.hpp"
#include "hw_models/profile.hpp"
#include "sim/cost.hpp"
#include "sim/network.hpp"
#include "temp_dir.hpp"

using namespace stratasim;
using namespace stratasim::exec;

namespace {

CalibrateOptions quick_host(int ranks = 1) {
  CalibrateOptions o;
  o.kind = DeviceKind::host;
  o.quick = true;
  o.repetitions = 3;
  o.ranks = ranks;
  o.device_name = "host-test";
  return o;
}

/// One profile measured once for the single-rank tests (each calibration takes a moment).
const hw::DeviceProfile& measured() {
  static const hw::DeviceProfile profile = calibrate(quick_host());
  return profile;
}

}  // namespace

TEST_CASE("calibrate: the host device gives a complete profile of positive figures") {
  std::ostringstream progress;
  const hw::DeviceProfile p = calibrate(DeviceKind::host, quick_host(), &progress);
  CHECK(p.device == "host-test");
  // Today in UTC, "YYYY-MM-DD" (not compared with utc_date_today(): midnight may pass).
  REQUIRE(p.date.size() == 10);
  CHECK(p.date[4] == '-');
  CHECK(p.date[7] == '-');
  CHECK(p.date.substr(0, 2) == "20");
  CHECK(p.source.find("stratasim calibrate, host, ") == 0);
  CHECK(p.source.find("3 repetitions") != std::string::npos);
  // Every dtype times every quick host shape ({32, 64}^3).
  CHECK(p.gemm.size() == 3 * 8);
  for (const auto& g : p.gemm) {
    CHECK(g.time > Time::zero());
    CHECK(g.m * g.n * g.k <= kHostKernelLimit);
  }
  for (DType t : {DType::bf16, DType::fp16, DType::fp32}) {
    REQUIRE(p.attention[static_cast<std::size_t>(t)].has_value());
    CHECK(p.attention[static_cast<std::size_t>(t)]->flops_per_second() > 0);
  }
  CHECK_FALSE(p.attention[static_cast<std::size_t>(DType::fp8)].has_value());
  REQUIRE(p.kernel_launch_overhead.has_value());
  CHECK(*p.kernel_launch_overhead >= Time::zero());
  CHECK(p.memory_bandwidth->bytes_per_second() > 0);
  CHECK(p.elementwise_bandwidth->bytes_per_second() > 0);
  CHECK(p.host_to_device_bandwidth->bytes_per_second() > 0);
  CHECK(p.device_to_host_bandwidth->bytes_per_second() > 0);
  CHECK(p.collectives.empty());  // one rank
  CHECK(progress.str().find("gemm bf16 64x64x64") != std::string::npos);
  CHECK(progress.str().find("kernel launch overhead") != std::string::npos);
}

TEST_CASE("calibrate: the profile is written and read back as schema version 2") {
  const hw::DeviceProfile& p = measured();
  const testing::TempDir tmp("exec");
  const auto file = tmp / "host-profile.json";
  hw::write_profile(p, file);
  const hw::DeviceProfile q = hw::load_profile(file);
  CHECK(q.schema_version == 2);
  CHECK(q.device == p.device);
  CHECK(q.date == p.date);
  CHECK(q.source == p.source);
  CHECK(q.kernel_launch_overhead == p.kernel_launch_overhead);
  CHECK(q.memory_bandwidth == p.memory_bandwidth);
  CHECK(q.elementwise_bandwidth == p.elementwise_bandwidth);
  CHECK(q.host_to_device_bandwidth == p.host_to_device_bandwidth);
  CHECK(q.device_to_host_bandwidth == p.device_to_host_bandwidth);
  REQUIRE(q.gemm.size() == p.gemm.size());
  for (std::size_t i = 0; i < p.gemm.size(); ++i) CHECK(q.gemm[i].time == p.gemm[i].time);
  for (DType t : kAllDTypes) {
    CHECK(q.attention[static_cast<std::size_t>(t)] == p.attention[static_cast<std::size_t>(t)]);
  }
}

TEST_CASE("calibrate: the cost model with the profile predicts a measured shape exactly") {
  hw::DeviceSpec device;
  device.name = "host-test";
  device.peak_flops[static_cast<std::size_t>(DType::bf16)] = FlopRate(1e12);
  device.memory_bandwidth = Bandwidth(1e10);
  device.kernel_launch_overhead = Time::us(5);
  device.profile = std::make_shared<const hw::DeviceProfile>(measured());
  const sim::DeviceCostModel cost(device);
  const hw::DeviceProfile& p = *device.profile;
  const Time launch = *p.kernel_launch_overhead;
  // A measured GEMM: the profile's launch overhead plus its measured (median) time.
  const hw::GemmMeasurement* row = p.find_gemm(64, 32, 64, 1, DType::bf16);
  REQUIRE(row != nullptr);
  CHECK(cost.kernel_time(strategies::Kernel{strategies::Gemm{64, 32, 64, 1, DType::bf16}, "g"}) ==
        launch + row->time);
  // A device-to-device copy of S bytes: the launch plus 2 S over the measured bandwidth (which
  // is 2 S / median time for the calibration's size, so a copy of that size costs its median,
  // up to the picosecond rounding of transfer_time).
  const Bytes s(4 << 20);  // the quick host copy size
  const Time copy = cost.kernel_time(strategies::Kernel{
      strategies::Copy{s, strategies::MemoryTier::device, strategies::MemoryTier::device}, "c"});
  const Time median_copy = Time::from_seconds(static_cast<double>(s.count() * 2) /
                                              p.memory_bandwidth->bytes_per_second());
  CHECK((copy - launch - median_copy).picoseconds() <= 1);
  CHECK((copy - launch - median_copy).picoseconds() >= 0);
}

TEST_CASE("calibrate: collectives over two host ranks become profile rows the network uses") {
  auto options = quick_host(2);
  options.dtypes = {DType::fp32};
  options.sizes = {Bytes(4096), Bytes(65536), Bytes(65536 + 8)};  // the last rounds to 65536
  std::ostringstream progress;
  const hw::DeviceProfile p = calibrate(options, &progress);
  // Six kinds at two distinct sizes.
  REQUIRE(p.collectives.size() == 6 * 2);
  for (const auto& c : p.collectives) {
    CHECK(c.ranks == 2);
    CHECK(c.time > Time::zero());
    CHECK((c.bytes == Bytes(4096) || c.bytes == Bytes(65536)));
  }
  CHECK(progress.str().find("all_to_all over 2 ranks") != std::string::npos);
  // Round trip, then an analytical network over a node of two such devices takes the rows.
  const testing::TempDir tmp("exec");
  const auto file = tmp / "host-collectives.json";
  hw::write_profile(p, file);
  const auto q = hw::load_profile(file);
  REQUIRE(q.collectives.size() == p.collectives.size());
  hw::ClusterSpec cluster;
  cluster.nodes = 1;
  cluster.devices_per_node = 2;
  cluster.device.name = "host-test";
  cluster.device.profile = std::make_shared<const hw::DeviceProfile>(q);
  cluster.intra_node = hw::LinkSpec{Bandwidth(1e9), Time::us(1)};
  cluster.inter_node = cluster.intra_node;
  strategies::Program program(2);
  program.add_group({0, 1}, "pair");
  const sim::AnalyticalNetwork network(cluster, program);
  const auto all_reduce = std::find_if(q.collectives.begin(), q.collectives.end(), [](auto& c) {
    return c.kind == 0 && c.bytes == Bytes(65536);
  });
  REQUIRE(all_reduce != q.collectives.end());
  CHECK(network.collective_time(strategies::CollectiveKind::all_reduce, 0, Bytes(65536)) ==
        all_reduce->time);
}

TEST_CASE("calibrate: options out of range are refused before anything runs") {
  auto o = quick_host();
  o.ranks = 0;
  CHECK_THROWS_AS(calibrate(o), std::invalid_argument);
  o = quick_host();
  o.repetitions = -1;
  CHECK_THROWS_AS(calibrate(o), std::invalid_argument);
  o = quick_host();
  o.gemm_shapes = {{1024, 1024, 1024}};  // 2^30 multiply-adds: beyond the host's limit
  CHECK_THROWS_AS(calibrate(o), std::invalid_argument);
  o = quick_host(4);
  o.sizes = {Bytes(32)};  // below 16 bytes per rank
  CHECK_THROWS_AS(calibrate(o), std::invalid_argument);
}

TEST_CASE("calibrate: default grids") {
  CHECK(default_repetitions(DeviceKind::host) == 5);
  CHECK(default_repetitions(DeviceKind::cuda) == 20);
  for (bool quick : {false, true}) {
    for (const auto& s : gemm_shapes(DeviceKind::host, quick)) {
      CHECK(s.m * s.n * s.k <= kHostKernelLimit);
    }
    for (Bytes b : collective_sizes(DeviceKind::host, quick)) {
      CHECK(b.count() <= kHostTransferLimit);
    }
  }
  const auto cuda = gemm_shapes(DeviceKind::cuda, false);
  // The 5^3 grid and the transformer shapes not already in it, each once.
  CHECK(cuda.size() >= 125);
  CHECK(std::find(cuda.begin(), cuda.end(), GemmShape{8192, 8192, 8192}) != cuda.end());
  CHECK(std::find(cuda.begin(), cuda.end(), GemmShape{4096, 12288, 4096}) != cuda.end());
  for (std::size_t i = 0; i < cuda.size(); ++i) {
    CHECK(std::find(cuda.begin() + static_cast<std::ptrdiff_t>(i) + 1, cuda.end(), cuda[i]) ==
          cuda.end());
  }
  const auto sizes = collective_sizes(DeviceKind::cuda, false);
  CHECK(sizes.front() == Bytes(64 * 1024));
  CHECK(sizes.back() == Bytes(1 << 30));
  CHECK(utc_date_today().size() == 10);
}
