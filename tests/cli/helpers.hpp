// Running the stratasim executable as a user runs it, for the CLI tests.
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "temp_dir.hpp"

namespace stratasim::testing::cli {

namespace fs = std::filesystem;

struct Result {
  int status;
  std::string output;  // stdout and stderr together
};

/// A shell command line, its stdout (and whatever it redirects there) and its exit status.
inline Result run_shell(const std::string& command) {
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  std::array<char, 4096> buffer{};
  std::size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

/// stratasim with `args`, stderr with stdout.
inline Result run(const std::string& args) {
  return run_shell(std::string(STRATASIM_BINARY) + " " + args + " 2>&1");
}

/// Each test case that writes files makes its own folder: `const TempDir tmp("cli");`.
using testing::TempDir;

inline std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Runs `args` and checks that it is bad input: exit code 2 and every text of `expected` in the
/// output.
inline void check_bad_input(const std::string& args, const std::vector<std::string>& expected) {
  CAPTURE(args);
  auto r = run(args);
  CAPTURE(r.output);
  CHECK(r.status == 2);
  for (const auto& text : expected) CHECK(r.output.find(text) != std::string::npos);
}

}  // namespace stratasim::testing::cli
