// `stratasim replay`: parses the flags, runs study::replay (study/replay.hpp) and prints the
// report as `simulate` does.
#include "cli/replay_command.hpp"

#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>

#include "cli/common.hpp"
#include "study/replay.hpp"
#include "traces/export.hpp"
#include "traces/report.hpp"

namespace stratasim::cli {

namespace fs = std::filesystem;

void add_replay_options(CLI::App* cmd, ReplayArgs& args) {
  cmd->add_option("trace", args.request.trace,
                  "The trace: a timeline.json or output folder (stratasim), a Chakra folder or "
                  "prefix, a Kineto JSON file or folder")
      ->required();
  cmd->add_option("--format", args.request.format, "chakra, kineto or stratasim")
      ->required()
      ->check(CLI::IsMember({"chakra", "kineto", "stratasim"}));
  cmd->add_option("--cluster", args.request.cluster,
                  "Cluster to replay on: file or catalog name (default: the trace's own)");
  cmd->add_option("--scale-compute", args.request.scale_compute,
                  "Compute runs this many times faster (e.g. 2 halves every compute time)");
  cmd->add_option("--ranks", args.request.ranks,
                  "Re-target to this many ranks by widening data parallelism (a multiple of "
                  "the trace's ranks)")
      ->check(positive_integer());
  cmd->add_option("--dp-groups", args.request.dp_groups,
                  "Regular expression naming the data-parallel groups (default: "
                  "\"^dp\\b|^data\\b|data[ _-]?parallel\", case-insensitive)");
  cmd->add_option("--step", args.request.step,
                  "Kineto: the ProfilerStep#N to replay (N), or all; default: the median step");
  cmd->add_option("--set", args.request.sets,
                  "Override a cluster value: cluster.key=value (repeatable), e.g. "
                  "cluster.inter_node.bandwidth=\"400 Gb/s\"");
  cmd->add_option("--out", args.out, "Write report.json, timeline.json and memory.csv here");
  cmd->add_flag("--quiet", args.quiet,
                "Print nothing on success: neither the report nor the notes (--no-notes hides "
                "only the notes)");
  cmd->add_flag("--no-notes", args.no_notes,
                "Hide the notes (\"note: ...\" on stderr: what was approximated or assumed); the "
                "report is printed");
  cmd->add_flag("--exact", args.request.exact,
                "With --ranks: simulate every new replica instead of mirroring them");
}

int replay_command(const ReplayArgs& args) {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  check_out_dir(args.out);
  const study::ReplayResult r = study::replay(args.request);
  if (!args.quiet && !args.no_notes) {
    for (const auto& n : r.notes) std::cerr << "note: " << n << "\n";
  }
  if (!args.quiet) {
    traces::print_summary(std::cout, r.report, r.context);
    const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
    std::cout << "replayed " << traces::with_commas(static_cast<std::int64_t>(r.program.op_count()))
              << " ops (" << traces::with_commas(static_cast<std::int64_t>(r.timeline.events))
              << " events) in " << std::fixed << std::setprecision(2) << elapsed << " s\n";
  }
  if (!args.out.empty()) {
    // A catalog name stays a name; a file is recorded by its absolute path.
    std::error_code ec;
    traces::ExportOptions export_options;
    export_options.ranks = r.traced_ranks;
    export_options.cluster = fs::exists(r.cluster_given, ec)
                                 ? fs::absolute(r.cluster_given, ec).lexically_normal().string()
                                 : r.cluster_given;
    traces::write_outputs(args.out, r.program, r.timeline, r.report, r.context, export_options);
    if (!args.quiet) {
      std::cout << "wrote " << (fs::path(args.out) / "report.json").string()
                << ", timeline.json and memory.csv\n";
    }
  }
  if (!r.timeline.completed && !r.timeline.stopped_on_oom) {
    std::cerr << "error: the replay did not complete: " << r.timeline.problem << "\n";
    return kExitSimulationFailed;
  }
  return 0;
}

}  // namespace stratasim::cli
