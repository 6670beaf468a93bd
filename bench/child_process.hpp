// Runs a command as its own process (fork, exec, wait4) and measures what it cost: wall time
// (steady clock, from fork to the child's exit), CPU time (the child's user + system time from
// wait4's rusage) and peak resident memory (ru_maxrss, KiB on Linux). Shared by the benches that
// time the stratasim executable as a user runs it (bench_startup, bench_scale). A bench helper,
// not a test: it times things.
#pragma once

#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace stratasim::bench {

struct ChildRun {
  double wall_s = 0;
  double cpu_s = 0;        // user + system time of the child
  double max_rss_mib = 0;  // the child's peak resident set size
  int exit_code = 0;       // -signal when it was killed by a signal, 127 when it could not start
};

/// Runs `argv` (argv[0] a path) with extra environment `env` (NAME=value). Its stdout and stderr
/// go to `output` (a file path; "/dev/null" discards them). Exits the bench when fork or wait4
/// fail; a failing child is reported through exit_code, not fatal.
inline ChildRun run_child(const std::vector<std::string>& argv,
                          const std::vector<std::string>& env = {},
                          const std::string& output = "/dev/null") {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::fflush(stdout);  // the child would print what is buffered again
  std::fflush(stderr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(1);
  }
  if (pid == 0) {
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    if (std::freopen(output.c_str(), "w", stdout) == nullptr) _exit(126);
    if (dup2(fileno(stdout), fileno(stderr)) < 0) _exit(126);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  rusage usage{};
  if (wait4(pid, &status, 0, &usage) != pid) {
    std::perror("wait4");
    std::exit(1);
  }
  const auto end = std::chrono::steady_clock::now();
  auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  ChildRun run;
  run.wall_s = std::chrono::duration<double>(end - start).count();
  run.cpu_s = seconds(usage.ru_utime) + seconds(usage.ru_stime);
  run.max_rss_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  return run;
}

/// The median of `values` (the mean of the two middle ones for an even count); 0 when empty.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace stratasim::bench
