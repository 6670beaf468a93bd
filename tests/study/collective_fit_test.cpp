// The collective sweeps as points (study/collective_fit.hpp), and the fitted fabrics'
// traceability: every fitted figure names the calibration cases it came from, and re-running the
// fit reproduces the committed figures.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "study/catalog.hpp"
#include "study/collective_fit.hpp"
#include "temp_dir.hpp"

using namespace stratasim;
namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const fs::path& file) {
  std::ifstream in(file);
  return nlohmann::json::parse(in);
}

const std::vector<study::CollectivePoint>& points() {
  static const auto p = study::collective_points(study::default_calibration_file());
  return p;
}

const study::CollectivePoint& point(const std::string& id) {
  for (const auto& p : points()) {
    if (p.id == id) return p;
  }
  FAIL("no point " << id);
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("collective points: mapping, busbw from the printed time, disturbed points") {
  // DGX H100, 1 GiB: out-of-place 4029.4 us, in-place 4016.4 us: the smaller, and busbw
  // 2^30 / 4016.4 us x 2 (8 - 1) / 8 = 467.80 GB/s (nccl-tests printed 467.85 in place).
  const auto& p = point("nccl-allreduce-dgx-h100-8gpu-dgxc/1073741824");
  CHECK(p.cluster == "dgx-h100-1");
  CHECK(p.ranks == 8);
  CHECK(p.published_seconds == doctest::Approx(4016.4e-6));
  CHECK(p.published_busbw == doctest::Approx(1073741824 / 4016.4e-6 * 1.75));
  // Only a busbw printed (all_reduce_bench.py, 4 nodes, 1 GiB at 361.99 GB/s): the time is
  // 2^30 x 2 (32 - 1) / 32 / 361.99e9 = 5.7466 ms.
  const auto& b = point("allreduce-bench-b200-4node/1073741824");
  CHECK(b.cluster == "p6-b200-4");
  CHECK(b.published_seconds == doctest::Approx(1073741824.0 * 62 / 32 / 361.99e9));
  // The NVLS-off figure of a GPU-count case is a second point with the ring fixed.
  const auto& off = point("nccl-allreduce-8gib-h200-6gpus-nvls-sweep/8589934592+ring");
  CHECK(off.fixed == hw::CollectiveAlgorithm::ring);
  CHECK(off.published_busbw == doctest::Approx(365.1e9));
  // 32 KiB on 4 nodes took 6.3 ms (busbw 0.01 GB/s), 128 KiB 0.56 ms: disturbed, left out.
  CHECK(point("allreduce-bench-b200-4node/32768").excluded.find("disturbed") == 0);
  CHECK_FALSE(point("allreduce-bench-b200-4node/131072").excluded.empty());  // 564 > 1.25 x 382 us
  CHECK(point("allreduce-bench-b200-4node/262144").excluded.empty());
  // send/recv is point to point.
  CHECK(point("nccl-sendrecv-a100-8gpu-nvlink/268435456").p2p);
}

TEST_CASE("fitted fabrics: every fitted figure traces to collective cases, and the fit reruns") {
  const fs::path dir = study::config_dir() / "hardware" / "nccl";
  std::set<std::string> collective_cases;
  for (const auto& p : points()) collective_cases.insert(p.case_id);
  int fitted = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".json" || entry.path().stem() == "tools") continue;
    const auto j = read_json(entry.path());
    if (!j.contains("fitted_to")) continue;
    ++fitted;
    CAPTURE(entry.path().string());
    CHECK_FALSE(j["fitted_to"].empty());
    for (const auto& id : j["fitted_to"]) CHECK(collective_cases.count(id.get<std::string>()) == 1);
    CHECK(j["fit"]["points"].get<int>() > 0);
  }
  CHECK(fitted >= 5);  // nvlink3, nvlink4, nvlink5, efa-v4, gcp-tcpxo

  // Re-run the fit into a copy: the committed figures come back (to their printed precision).
  const testing::TempDir tmp("collective-fit");
  for (const auto& entry : fs::directory_iterator(dir)) {
    fs::copy_file(entry.path(), tmp.path() / entry.path().filename());
  }
  const auto fits = study::fit_collectives(study::default_calibration_file(), tmp.path());
  CHECK(fits.size() >= 6);
  for (const auto& f : fits) {
    const bool tool = f.values.contains("overhead");
    const auto committed = read_json(dir / (tool ? "tools.json" : f.name + ".json"));
    const auto refit = read_json(tmp.path() / (tool ? "tools.json" : f.name + ".json"));
    CAPTURE(f.name);
    if (tool) {
      CHECK(committed["tools"][f.name]["fitted_to"] == refit["tools"][f.name]["fitted_to"]);
      continue;
    }
    CHECK(committed["fitted_to"] == refit["fitted_to"]);
    if (committed.contains("efficiency") && f.values.contains("efficiency")) {
      CHECK(refit["efficiency"].get<double>() ==
            doctest::Approx(committed["efficiency"].get<double>()).epsilon(0.01));
    }
    CHECK(refit["fit"]["mean_abs_error"].get<double>() ==
          doctest::Approx(committed["fit"]["mean_abs_error"].get<double>()).epsilon(0.05));
  }
}
