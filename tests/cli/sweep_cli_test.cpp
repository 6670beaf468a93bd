// `stratasim sweep` and `stratasim search` as a user runs them: deterministic CSVs for any
// --jobs, resume after an interruption, SIGTERM, MPI processes, exit codes.
#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "cli/helpers.hpp"

using namespace stratasim::testing::cli;

namespace {

// gpt-tiny on 8 GPUs: 3 x 2 x 2 x 2 x 2 = 48 combinations, some invalid (tp 8 > 4 heads;
// micro batch 2 with dp 8 does not divide the global batch of 8), in well under a second.
const std::string kSmall = std::string(STRATASIM_SOURCE_DIR) +
                           "/configs/experiments/gpt-tiny-3d-8.json --tp 1,2,8 --pp 1,2 "
                           "--zero 0,3 --recompute none,full --micro-batch 1,2";

std::size_t lines(const std::string& text) {
  return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}

}  // namespace

TEST_CASE("sweep: the same CSV for any --jobs, with a summary") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("sweep-jobs");
  const auto one = run("sweep " + kSmall + " --jobs 1 --out " + (dir / "one.csv").string());
  REQUIRE(one.status == 0);
  CHECK(one.output.find("48 of 48 combinations") != std::string::npos);
  CHECK(one.output.find("best that fits") != std::string::npos);
  CHECK(one.output.find("invalid combinations") != std::string::npos);
  CHECK(one.output.find("attention heads") != std::string::npos);  // a reason, listed
  const auto two = run("sweep " + kSmall + " --jobs 2 --quiet --out " + (dir / "two.csv").string());
  REQUIRE(two.status == 0);
  const std::string text = read(dir / "one.csv");
  CHECK(text == read(dir / "two.csv"));
  CHECK(lines(text) == 48 + 1);
  CHECK(text.rfind("tp,pp,dp,zero,recompute,micro_batch,", 0) == 0);
}

TEST_CASE("sweep: --resume after a cut continues to an uninterrupted run's bytes") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("sweep-resume");
  const auto csv = (dir / "s.csv").string();
  REQUIRE(run("sweep " + kSmall + " --quiet --out " + csv).status == 0);
  const std::string full = read(csv);
  // Keep the header, 10 rows and part of the 11th.
  std::size_t cut = 0;
  for (int k = 0; k < 11; ++k) cut = full.find('\n', cut) + 1;
  {
    std::ofstream out(csv, std::ios::binary | std::ios::trunc);
    out << full.substr(0, cut + 5);
  }
  const auto resumed = run("sweep " + kSmall + " --resume --out " + csv);
  CHECK(resumed.status == 0);
  CHECK(resumed.output.find("resuming: 10 of 48") != std::string::npos);
  CHECK(read(csv) == full);
  // Resuming with another grid is refused, naming the line, and leaves the file alone.
  const auto other =
      run("sweep " + std::string(STRATASIM_SOURCE_DIR) +
          "/configs/experiments/gpt-tiny-3d-8.json --tp 2 --pp 1,2 --resume --out " + csv);
  CHECK(other.status == 2);
  CHECK(other.output.find("line 2") != std::string::npos);
  CHECK(read(csv) == full);
}

TEST_CASE("sweep: SIGTERM keeps the finished prefix and --resume completes it") {
  // GPT-3 175B on 1,024 GPUs, 144 combinations of 10 to 100 ms each on one thread; the signal
  // comes once 3 rows are written, long before the end.
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("sweep-signal");
  const auto csv = (dir / "s.csv").string();
  const std::string grid =
      " gpt3-175b-a100-1024 --tp 4,8 --pp 8,16 --zero 0..3 --recompute none,selective,full "
      "--micro-batch 1,2,4 --jobs 1 --out ";
  const std::string command = "sh -c '" + std::string(STRATASIM_BINARY) + " sweep" + grid + csv +
                              " & pid=$!; while kill -0 $pid 2>/dev/null && [ $(cat " + csv +
                              " 2>/dev/null | wc -l) -lt 4 ]; do sleep 0.02; done; "
                              "kill -TERM $pid; wait $pid; echo exit=$?' 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[4096];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  pclose(pipe);
  CAPTURE(output);
  CHECK(output.find("exit=130") != std::string::npos);
  CHECK(output.find("; --resume continues") != std::string::npos);
  const std::string partial = read(csv);
  CHECK(lines(partial) >= 4);
  CHECK(lines(partial) < 144 + 1);
  const auto resumed = run("sweep" + grid + csv + " --resume --quiet");
  CHECK(resumed.status == 0);
  const std::string after = read(csv);
  CHECK(after.rfind(partial, 0) == 0);  // the kept rows are untouched
  REQUIRE(run("sweep" + grid + (dir / "full.csv").string() + " --quiet").status == 0);
  CHECK(after == read(dir / "full.csv"));
}

TEST_CASE("sweep: bad lists and flags are exit 2 naming the flag") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("sweep-errors");
  const auto out = " --out " + (dir / "x.csv").string();
  const std::string exp =
      std::string(STRATASIM_SOURCE_DIR) + "/configs/experiments/gpt-tiny-3d-8.json";
  for (const auto& [flags, expected] :
       std::vector<std::pair<std::string, std::string>>{{"--tp 1,x", "--tp"},
                                                        {"--pp 0", "--pp"},
                                                        {"--zero 0..5", "--zero"},
                                                        {"--recompute none,fast", "--recompute"},
                                                        {"--micro-batch 4..1", "--micro-batch"},
                                                        {"--schedule 1f1b,nope", "--schedule"}}) {
    CAPTURE(flags);
    const auto r = run("sweep " + exp + " " + flags + out);
    CHECK(r.status == 2);
    CHECK(r.output.find(expected) != std::string::npos);
  }
  CHECK(run("sweep " + exp).status == 2);  // --out is required
  const auto missing = run("sweep no-such-experiment" + out);
  CHECK(missing.status == 2);
  CHECK(missing.output.find("no-such-experiment") != std::string::npos);
}

TEST_CASE("search: pruning counts, top-k, the Pareto frontier and a CSV") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("search");
  const std::string exp =
      std::string(STRATASIM_SOURCE_DIR) + "/configs/experiments/gpt3-1.7b-a100-8.json";
  const auto r = run("search " + exp +
                     " --gpus 8 --set cluster.device.memory.capacity=\"16 GiB\" --top 3 --out " +
                     (dir / "search.csv").string());
  REQUIRE(r.status == 0);
  CHECK(r.output.find("pruned (model states alone exceed a device)") != std::string::npos);
  CHECK(r.output.find("top 3 by throughput") != std::string::npos);
  CHECK(r.output.find("Pareto frontier") != std::string::npos);
  const std::string csv = read(dir / "search.csv");
  CHECK(csv.substr(0, csv.find('\n')).ends_with(",fits,gpus,rank,pareto,virtual_stages,framework"));
  CHECK(lines(csv) == 252 + 1);  // every combination of the space (search_test counts them)
  CHECK(csv.find(",1,true,,\n") != std::string::npos);  // the best is on the frontier
  // Deterministic: the same bytes again with another thread count.
  REQUIRE(run("search " + exp +
              " --gpus 8 --set cluster.device.memory.capacity=\"16 GiB\" --quiet --jobs 1 --out " +
              (dir / "again.csv").string())
              .status == 0);
  CHECK(read(dir / "again.csv") == csv);

  CHECK(run("search " + exp + " --gpus 8 --objective speed").status == 2);
  const auto odd = run("search " + exp + " --gpus 12");
  CHECK(odd.status == 2);
  CHECK(odd.output.find("--gpus 12") != std::string::npos);
  const auto cost = run("search " + exp + " --gpus 8 --objective cost --top 1");
  CHECK(cost.status == 0);
  CHECK(cost.output.find("top 1 by cost") != std::string::npos);
}

TEST_CASE("search: schedules, virtual stages, sequence parallelism and FSDP as columns") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("search-axes");
  const std::string exp = std::string(STRATASIM_SOURCE_DIR) +
                          "/configs/experiments/gpt3-1.7b-a100-8.json --gpus 8 --zero 1 "
                          "--recompute full --micro-batch 1";
  const auto r = run("search " + exp +
                     " --schedules 1f1b,interleaved --interleave 2 --sequence-parallel 0,1 "
                     "--try-fsdp --top 100 --out " +
                     (dir / "search.csv").string());
  REQUIRE(r.status == 0);
  CHECK(r.output.find("sharding  schedule     v  sp") != std::string::npos);
  CHECK(r.output.find("interleaved  2 ") != std::string::npos);
  CHECK(r.output.find(" yes ") != std::string::npos);  // sequence parallelism on
  CHECK(r.output.find("fsdp") != std::string::npos);
  const std::string csv = read(dir / "search.csv");
  // (tp, pp) pairs with one ZeRO stage (as search_test counts them, with zero 1 only):
  // sharding 1 + FSDP where pp 1 and dp > 1: (1,1) 2, (1,2) 2 (1f1b, x2), (1,4) 2, (1,8) 1,
  // (2,1) 2*2, (2,2) 2*2, (2,4) 2*2, (4,1) 2*2, (4,2) 2*2, (8,1) 1*2 = 29 rows.
  CHECK(lines(csv) == 29 + 1);
  CHECK(csv.find(",fsdp\n") != std::string::npos);
  for (const auto& bad : {std::string("--schedules 1f1b,gpipe2"), std::string("--interleave 1"),
                          std::string("--sequence-parallel 2")}) {
    const auto b = run("search " + exp + " " + bad);
    CHECK(b.status == 2);
    CHECK(b.output.find(bad.substr(0, bad.find(' '))) != std::string::npos);
  }
}

TEST_CASE("sweep under mpirun: rank 0 gathers the same CSV as a threaded run") {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) {
    MESSAGE("mpirun is not installed: the MPI sweep is not tested");
    return;
  }
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("sweep-mpi");
  REQUIRE(run("sweep " + kSmall + " --quiet --out " + (dir / "threads.csv").string()).status == 0);
  // As root in a container: OpenMPI refuses root unless told, and needs no ssh on one node.
  const std::string command =
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm=isolated "
      "OMPI_MCA_rmaps_base_oversubscribe=1 timeout 120 mpirun --allow-run-as-root "
      "--oversubscribe -np 2 " +
      std::string(STRATASIM_BINARY) + " sweep " + kSmall + " --jobs 1 --out " +
      (dir / "mpi.csv").string() + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[4096];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  CAPTURE(output);
  if (output.find("built without MPI") != std::string::npos) {
    CHECK(WEXITSTATUS(status) == 2);  // the clear error of a build without MPI
    return;
  }
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK(output.find("in each of 2 processes") != std::string::npos);
  CHECK(read(dir / "mpi.csv") == read(dir / "threads.csv"));
}

TEST_CASE("sweep: --resume refuses a file written by other flags or another experiment") {
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("sweep-resume-other");
  const auto csv = (dir / "sweep.csv").string();
  REQUIRE(run("sweep " + kSmall + " --quiet --out " + csv).status == 0);
  // Same grid, another global batch: the grid columns match, the figures do not.
  auto r = run("sweep " + kSmall + " --global-batch 16 --resume --quiet --out " + csv);
  CAPTURE(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("written by another experiment or other flags") != std::string::npos);
  // Same flags: the file is complete and accepted as it is.
  r = run("sweep " + kSmall + " --resume --quiet --out " + csv);
  CHECK(r.status == 0);
}

TEST_CASE("sweep and search: unwritable outputs and impossible budgets are exit 2 up front") {
  // /dev/full accepts the open and fails every write: the sweep stops at its first row instead
  // of running the whole grid.
  if (std::filesystem::exists("/dev/full")) {
    const auto r = run("sweep " + kSmall + " --quiet --out /dev/full");
    CAPTURE(r.output);
    CHECK(r.status == 2);
    CHECK(r.output.find("--out /dev/full") != std::string::npos);
  }
  const std::string exp =
      std::string(STRATASIM_SOURCE_DIR) + "/configs/experiments/gpt3-1.7b-a100-8.json";
  auto r = run("search " + exp + " --gpus 8 --objective cost --min-gpus 16");
  CHECK(r.status == 2);
  CHECK(r.output.find("--min-gpus 16") != std::string::npos);
  const TempDir tmp("cli");
  const auto dir = tmp.subdir("search-out-folder");
  r = run("search " + exp + " --gpus 8 --out " + dir.string());
  CHECK(r.status == 2);
  CHECK(r.output.find("expected a CSV file name") != std::string::npos);
}
