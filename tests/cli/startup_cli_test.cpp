// What the executable loads: CUDA, cuBLASLt, NCCL and MPI are plugins (hw_models/plugin.hpp)
// that only the commands needing them load, and a plugin that is missing or broken is a clear
// error (exit 2) naming what is missing. The loaded libraries come from the dynamic loader's own
// log (LD_DEBUG=libs: every library it initialises, dlopen'ed ones too).
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "cli/helpers.hpp"

using namespace stratasim::testing::cli;

namespace {

const std::string kTiny =
    std::string(STRATASIM_SOURCE_DIR) + "/configs/experiments/gpt-tiny-3d-8.json";

// Runs `command` (a shell command line) and returns its status and output.
Result shell(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[4096];
  std::size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

// The libraries the loader initialised while stratasim ran `args` (its log in `dir`).
std::string loaded_by(const std::string& args, const fs::path& dir) {
  const auto r = shell("LD_DEBUG=libs LD_DEBUG_OUTPUT=" + (dir / "ld").string() + " " +
                       STRATASIM_BINARY + " " + args);
  CAPTURE(r.output);
  REQUIRE(r.status == 0);
  std::string log;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().filename().string().rfind("ld.", 0) == 0) log += read(entry.path());
  }
  fs::remove_all(dir);
  fs::create_directories(dir);
  REQUIRE(log.find("calling init: ") != std::string::npos);  // the log is there
  return log;
}

// A copy of the executable in a folder of its own: no plugin beside it or in ../lib/stratasim.
fs::path lone_binary(const fs::path& dir) {
  fs::create_directories(dir / "alone" / "bin");
  const fs::path copy = dir / "alone" / "bin" / "stratasim";
  fs::copy_file(STRATASIM_BINARY, copy, fs::copy_options::overwrite_existing);
  return copy;
}

}  // namespace

TEST_CASE("startup: --version and a simulation load no GPU or MPI library") {
  const TempDir tmp("startup-libs");
  const fs::path dir = tmp.path();
  for (const std::string& args : {std::string("--version"), "simulate " + kTiny + " --quiet"}) {
    CAPTURE(args);
    const std::string log = loaded_by(args, dir);
    for (const char* heavy :
         {"libcuda", "libcublas", "libnccl", "libmpi", "libstratasim_cuda", "libstratasim_mpi"}) {
      CAPTURE(heavy);
      CHECK(log.find(heavy) == std::string::npos);
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("startup: --device cuda without the CUDA plugin says what is missing, exit 2") {
  const TempDir tmp("startup-no-cuda");
  const fs::path dir = tmp.path();
  const fs::path binary = lone_binary(dir);
  auto r = shell("env -u STRATASIM_PLUGIN_DIR " + binary.string() + " run " + kTiny +
                 " --iterations 1 --device cuda");
  CAPTURE(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("cannot run on CUDA devices") != std::string::npos);
  CHECK(r.output.find("--device host") != std::string::npos);
#ifdef STRATASIM_HAVE_CUDA_DEVICE
  CHECK(r.output.find("libstratasim_cuda.so was not found") != std::string::npos);
  CHECK(r.output.find((dir / "alone" / "bin").string()) != std::string::npos);
  // A file of that name that is no library: the loader's reason, and where the file is.
  fs::create_directories(dir / "broken");
  std::ofstream(dir / "broken" / "libstratasim_cuda.so") << "not a library\n";
  r = shell("STRATASIM_PLUGIN_DIR=" + (dir / "broken").string() + " " + binary.string() +
            " validate " + kTiny + " --iterations 1 --device cuda");
  CAPTURE(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("cannot load " + (dir / "broken" / "libstratasim_cuda.so").string()) !=
        std::string::npos);
#else
  CHECK(r.output.find("has no CUDA device") != std::string::npos);
#endif
  fs::remove_all(dir);
}

TEST_CASE("startup: a sweep under an MPI launcher without the MPI plugin says so, exit 2") {
  const TempDir tmp("startup-no-mpi");
  const fs::path dir = tmp.path();
  const fs::path binary = lone_binary(dir);
  // The launcher's environment is all that makes a sweep use MPI; no mpirun is needed.
  const auto r = shell("env -u STRATASIM_PLUGIN_DIR OMPI_COMM_WORLD_SIZE=2 " + binary.string() +
                       " sweep " + kTiny + " --tp 1,2 --quiet --out " + (dir / "s.csv").string());
  CAPTURE(r.output);
  CHECK(r.status == 2);
  CHECK(r.output.find("started by an MPI launcher (mpirun)") != std::string::npos);
  CHECK((r.output.find("libstratasim_mpi.so was not found") != std::string::npos ||
         r.output.find("built without MPI") != std::string::npos));
  CHECK(r.output.find("without mpirun") != std::string::npos);
  CHECK(!fs::exists(dir / "s.csv"));
  fs::remove_all(dir);
}

TEST_CASE("startup: the CUDA plugin's MPI world starts MPI under mpirun") {
  if (std::system("command -v mpirun > /dev/null 2>&1") != 0) {
    MESSAGE("mpirun is not installed: the CUDA plugin's MPI world is not tested");
    return;
  }
  // Two processes for a strategy of eight ranks: every process initialises MPI inside the
  // plugin, checks, agrees with the other (MPI_Allreduce) and stops with the same clear error.
  const auto r = shell(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm=isolated "
      "OMPI_MCA_rmaps_base_oversubscribe=1 timeout 120 mpirun --allow-run-as-root "
      "--oversubscribe -np 2 " +
      std::string(STRATASIM_BINARY) + " run " + kTiny + " --iterations 1 --launch mpi");
  CAPTURE(r.output);
  CHECK(r.status != 0);
#ifdef STRATASIM_HAVE_CUDA_DEVICE
  const bool explained =
      r.output.find("the strategy needs 8 ranks; mpirun started 2 processes") !=
          std::string::npos ||
      r.output.find("has no MPI") != std::string::npos;  // a CUDA build without MPI
  CHECK(explained);
#else
  CHECK(r.output.find("has no CUDA device") != std::string::npos);
#endif
}
