// Published trace formats and the generator (cluster/workload.hpp), and the headline comparison:
// ONES against FIFO and Tiresias on the shipped Philly-like trace on 64 GPUs.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "cluster/scheduler.hpp"
#include "cluster/simulator.hpp"
#include "cluster/throughput.hpp"
#include "cluster/workload.hpp"
#include "helpers.hpp"
#include "study/errors.hpp"
#include "temp_dir.hpp"
#include "test_paths.hpp"

using namespace stratasim;
using namespace stratasim::cluster;

namespace {

Recorded philly(const std::string& text) {
  std::istringstream in(text);
  return read_philly(in, "log.json");
}

Recorded helios(const std::string& text) {
  std::istringstream in(text);
  return read_helios(in, "log.csv");
}

// Two jobs on one cluster: a (submitted 00:00:00; attempts 00:01:00-00:02:00 on 8 + 2 GPUs, then
// 00:05:00-01:05:00), b (no attempt: skipped), c (submitted 00:10:00, 1 GPU, 00:10:00-00:40:00).
const char* kPhilly = R"([
 {"status": "Pass", "vc": "v", "jobid": "a", "user": "u", "submitted_time": "2017-10-07 00:00:00",
  "attempts": [{"start_time": "2017-10-07 00:01:00", "end_time": "2017-10-07 00:02:00",
                "detail": [{"ip": "m1", "gpus": ["gpu0","gpu1","gpu2","gpu3","gpu4","gpu5","gpu6","gpu7"]},
                           {"ip": "m2", "gpus": ["gpu0","gpu1"]}]},
               {"start_time": "2017-10-07 00:05:00", "end_time": "2017-10-07 01:05:00",
                "detail": [{"ip": "m3", "gpus": ["gpu0"]}]}]},
 {"status": "Killed", "vc": "v", "jobid": "b", "user": "u", "submitted_time": "2017-10-07 00:03:00",
  "attempts": []},
 {"status": "Failed", "vc": "v", "jobid": "c", "user": "u", "submitted_time": "2017-10-07 00:10:00",
  "attempts": [{"start_time": "2017-10-07 00:10:00", "end_time": "2017-10-07 00:40:00",
                "detail": [{"ip": "m4", "gpus": ["gpu3"]}]}]}
])";

ClusterResult run_on_philly_64(const std::string& policy, const SimulatedThroughput& speeds) {
  const JobTrace trace = read_workload(testing::configs_dir() / "cluster" / "philly-64.json",
                                       TraceFormat::philly, 64, speeds);
  SchedulerOptions options;
  options.seed = 1;
  const auto scheduler = make_scheduler(policy, options);
  SimulationOptions sim;
  sim.total_gpus = 64;
  return simulate_cluster(trace, *scheduler, speeds, sim);
}

}  // namespace

TEST_CASE("a Philly cluster_job_log reads as the trace's notebook reads it") {
  const Recorded r = philly(kPhilly);
  REQUIRE(r.jobs.size() == 2);
  CHECK(r.skipped == 1);
  // a: the first attempt's GPUs (8 + 2), from its first start (00:01:00) to its last end
  // (01:05:00): 3,840 s.
  CHECK(r.jobs[0].id == "a");
  CHECK(r.jobs[0].gpus == 10);
  CHECK(r.jobs[0].run_s == 3840);
  CHECK(r.jobs[0].submit_s == 0);
  // c: 1 GPU, 1,800 s, submitted 600 s after a.
  CHECK(r.jobs[1].id == "c");
  CHECK(r.jobs[1].gpus == 1);
  CHECK(r.jobs[1].run_s == 1800);
  CHECK(r.jobs[1].submit_s == 600);
}

TEST_CASE("a Helios cluster_log.csv reads by its header") {
  // The README's example rows (gpu_num, submit_time, duration), and a CPU job (gpu_num 0).
  const Recorded r = helios(
      "job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,"
      "queue\n"
      "1425511,uXBbc,vcJkd,1,1,1,COMPLETED,2020-06-09 18:41:01,2020-06-09 18:41:01,2020-06-10 "
      "04:55:09,36848,0\n"
      "1425512,uVMrF,vchbv,4,16,1,FAILED,2020-06-09 18:41:27,2020-06-09 18:41:27,2020-06-09 "
      "18:45:36,249,0\n"
      "1425514,uzqls,vcpDC,0,1,1,COMPLETED,2020-06-09 18:41:28,2020-06-09 18:41:28,2020-06-09 "
      "18:42:28,60,0\n");
  REQUIRE(r.jobs.size() == 2);
  CHECK(r.skipped == 1);
  CHECK(r.jobs[0].gpus == 1);
  CHECK(r.jobs[0].run_s == 36848);
  CHECK(r.jobs[1].gpus == 4);
  CHECK(r.jobs[1].submit_s == 26);  // 18:41:27 - 18:41:01
}

TEST_CASE("bad Philly and Helios input names the file, the place and the field") {
  const auto philly_error = [](const std::string& text, const char* expected) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(philly(text), doctest::Contains(expected), study::BadInput);
  };
  philly_error("{}", "log.json: expected a JSON array of jobs");
  philly_error("[1", "log.json: not JSON");
  philly_error(R"([{"jobid": "a", "submitted_time": "2017-13-01 00:00:00", "attempts": []}])",
               "log.json: jobs[0].submitted_time: expected \"YYYY-MM-DD HH:MM:SS\"");
  philly_error(
      R"([{"jobid": "a", "submitted_time": "2017-10-01 00:00:00", "attempts": [{"start_time": "2017-10-01 02:00:00", "end_time": "2017-10-01 01:00:00", "detail": [{"ip": "m", "gpus": ["gpu0"]}]}]}])",
      "log.json: jobs[0].attempts[0].end_time: before the first attempt's start_time");
  philly_error(R"([{"submitted_time": "2017-10-01 00:00:00", "attempts": []}])",
               "log.json: jobs[0].jobid: expected a string");
  const auto helios_error = [](const std::string& text, const char* expected) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(helios(text), doctest::Contains(expected), study::BadInput);
  };
  const std::string header = "job_id,gpu_num,submit_time,duration\n";
  helios_error("job_id,submit_time,duration\n1,2020-06-09 18:41:01,5\n",
               "log.csv:1: the header lacks the column gpu_num");
  helios_error(header + "1,1,2020-06-09 18:41:01,5\n2,two,2020-06-09 18:41:01,5\n",
               "log.csv:3: gpu_num: expected a number >= 0, got \"two\"");
  helios_error(header + "1,1,2020-06-09 18:41:01,-5\n",
               "log.csv:2: duration: expected a number >= 0");
  helios_error(header + "1,1,yesterday,5\n", "log.csv:2: submit_time: expected");
  helios_error(header + "1,1,2020-06-09 18:41:01\n", "log.csv:2: expected 4 cells, got 3");
}

TEST_CASE("the mapping rule picks a catalog experiment by GPUs and run time") {
  CHECK(map_job(1, 3600).experiment == "lstm-2x1024-a100-8");
  CHECK(map_job(2, 3 * 3600).experiment == "lstm-gnmt-8x1024-a100-8");
  CHECK(map_job(4, 3600).experiment == "lstm-gnmt-8x1024-a100-8");
  CHECK(map_job(8, 5 * 3600).experiment == "gpt3-1.7b-a100-8");
  CHECK(map_job(16, 60).experiment == "gpt3-1.7b-a100-8");
  // a's 10 GPUs round up to 16, above an 8-GPU cluster: refused, naming the job.
  const SimulatedThroughput speeds;
  CHECK_THROWS_WITH_AS(map_recorded(philly(kPhilly), 8, speeds),
                       doctest::Contains("log.json: jobs[0]: gpus: the job asks for 10 GPUs (16 "
                                         "rounded), more than the cluster's 8"),
                       study::BadInput);
  // On 16 GPUs: c (1 GPU, 1,800 s) runs lstm-2x1024 for 1,800 s x its speed at 1 GPU.
  const JobTrace t = map_recorded(philly(kPhilly), 16, speeds);
  REQUIRE(t.jobs.size() == 2);
  const Job& c = t.jobs[1];
  CHECK(c.experiment == "lstm-2x1024-a100-8");
  CHECK(c.samples == std::floor(1800 * speeds.speed(c, 1).samples_per_s));
  CHECK(c.batch == 512);  // the experiment's global batch
  CHECK(c.max_batch == 4 * 512);
  CHECK(c.min_gpus == 1);
  CHECK(c.max_gpus == 2);
}

TEST_CASE("the generator is deterministic and the shipped samples are its output") {
  const SimulatedThroughput speeds;
  GenerateOptions o;
  o.jobs = 100;
  o.gpus = 64;
  o.load = 1.5;
  o.seed = 1;
  std::ostringstream philly_text, again;
  write_generated(philly_text, o, speeds);
  write_generated(again, o, speeds);
  CHECK(philly_text.str() == again.str());
  // configs/cluster/README.md's commands.
  const auto file_text = [](const char* name) {
    std::ifstream in(testing::configs_dir() / "cluster" / name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  CHECK(philly_text.str() == file_text("philly-64.json"));
  o.format = TraceFormat::helios;
  o.mix = "helios";
  o.jobs = 60;
  std::ostringstream helios_text;
  write_generated(helios_text, o, speeds);
  CHECK(helios_text.str() == file_text("helios-64.csv"));
  // The generated jobs' GPUs come from the mix and stay within the cluster.
  o.gpus = 8;
  for (const RecordedJob& j : generate_recorded(o).jobs) {
    CHECK(j.gpus >= 1);
    CHECK(j.gpus <= 8);
    CHECK(j.run_s >= 60);
  }
}

TEST_CASE("headline: ONES beats FIFO and Tiresias on average JCT on the Philly-like trace") {
  // configs/cluster/philly-64.json (100 jobs, seed 1, load 1.5) on 64 GPUs, speeds simulated and
  // memoised; ONES with seed 1. The figures are in docs/cluster.md.
  const SimulatedThroughput speeds;
  const ClusterResult fifo = run_on_philly_64("fifo", speeds);
  const ClusterResult tiresias = run_on_philly_64("tiresias", speeds);
  const ClusterResult ones = run_on_philly_64("ones", speeds);
  CHECK(ones.summary.jobs == 100);
  CHECK(ones.summary.mean_jct_s < fifo.summary.mean_jct_s);
  CHECK(ones.summary.mean_jct_s < tiresias.summary.mean_jct_s);
  // The same seed: the same schedule, byte for byte.
  CHECK(testing::outputs(run_on_philly_64("ones", speeds)) == testing::outputs(ones));
}

TEST_CASE("the trace format flag names what it expects") {
  CHECK(parse_trace_format("philly", "--trace-format") == TraceFormat::philly);
  CHECK_THROWS_WITH_AS(parse_trace_format("alibaba", "--trace-format"),
                       doctest::Contains("--trace-format: expected jsonl, philly or helios"),
                       study::BadInput);
  GenerateOptions o;
  o.mix = "pai";
  CHECK_THROWS_WITH_AS(generate_recorded(o), doctest::Contains("--mix: expected philly or helios"),
                       study::BadInput);
}

TEST_CASE("a generated jsonl trace reads back as the mapped jobs") {
  const SimulatedThroughput speeds;
  GenerateOptions o;
  o.format = TraceFormat::jsonl;
  o.jobs = 20;
  o.gpus = 16;
  o.seed = 9;
  std::ostringstream text;
  write_generated(text, o, speeds);
  CHECK(text.str().rfind("# Generated by `stratasim cluster-trace generate --format jsonl", 0) ==
        0);
  std::istringstream in(text.str());
  const JobTrace read = parse_trace(in, "generated.jsonl", 16, true);
  const JobTrace mapped = map_recorded(generate_recorded(o), 16, speeds);
  REQUIRE(read.jobs.size() == mapped.jobs.size());
  for (std::size_t i = 0; i < read.jobs.size(); ++i) {
    const Job &a = read.jobs[i], &b = mapped.jobs[i];
    CAPTURE(a.id);
    CHECK(a.id == b.id);
    CHECK(a.arrival_s == b.arrival_s);
    CHECK(a.experiment == b.experiment);
    CHECK(a.samples == b.samples);
    CHECK(a.gpus == b.gpus);
    CHECK(a.min_gpus == b.min_gpus);
    CHECK(a.max_gpus == b.max_gpus);
    CHECK(a.batch == b.batch);  // the experiment's, read back from it
    CHECK(a.max_batch == b.max_batch);
    CHECK(a.noise_scale == b.noise_scale);
  }
}
