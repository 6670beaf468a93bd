#include "cluster/trace.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cluster/efficiency.hpp"
#include "hw_models/config_reader.hpp"
#include "strategies/experiment.hpp"
#include "study/catalog.hpp"
#include "study/errors.hpp"

namespace stratasim::cluster {

namespace {

using nlohmann::json;

struct LineError {
  const std::string& source;
  int line;
  [[noreturn]] void operator()(const std::string& field, const std::string& what) const {
    std::string where = source + ":" + std::to_string(line) + ": ";
    if (!field.empty()) where += field + ": ";
    throw study::BadInput(where + what);
  }
};

const std::set<std::string>& known_fields() {
  static const std::set<std::string> fields = {
      "id",        "arrival_s",  "experiment", "samples",  "epochs", "dataset_samples",
      "gpus",      "min_gpus",   "max_gpus",   "priority", "batch",  "min_batch",
      "max_batch", "noise_scale"};
  return fields;
}

double number(const json& o, const char* field, const LineError& fail, bool required) {
  if (!o.contains(field)) {
    if (required) fail(field, "missing (a number is expected)");
    return -1;
  }
  const json& v = o.at(field);
  if (!v.is_number()) fail(field, "expected a number, got " + v.dump());
  const double d = v.get<double>();
  if (!std::isfinite(d) || d < 0) fail(field, "expected a number >= 0, got " + v.dump());
  return d;
}

int integer(const json& o, const char* field, const LineError& fail, int fallback) {
  if (!o.contains(field)) return fallback;
  const json& v = o.at(field);
  if (!v.is_number_integer() || v.get<std::int64_t>() < -1'000'000'000 ||
      v.get<std::int64_t>() > 1'000'000'000) {
    fail(field, "expected an integer, got " + v.dump());
  }
  return static_cast<int>(v.get<std::int64_t>());
}

std::string text(const json& o, const char* field, const LineError& fail) {
  if (!o.contains(field)) fail(field, "missing (a string is expected)");
  if (!o.at(field).is_string() || o.at(field).get<std::string>().empty()) {
    fail(field, "expected a non-empty string, got " + o.at(field).dump());
  }
  return o.at(field).get<std::string>();
}

double samples_of(const json& o, const LineError& fail) {
  if (o.contains("samples")) {
    if (o.contains("epochs")) fail("epochs", "give either samples or epochs, not both");
    const double s = number(o, "samples", fail, true);
    if (s <= 0) fail("samples", "expected a number > 0");
    return s;
  }
  if (!o.contains("epochs"))
    fail("samples", "missing (give samples, or epochs and dataset_samples)");
  const double epochs = number(o, "epochs", fail, true);
  const double dataset = number(o, "dataset_samples", fail, true);
  if (epochs <= 0 || dataset <= 0) fail("epochs", "epochs and dataset_samples must be > 0");
  return epochs * dataset;
}

void check_gpus(const Job& job, int cluster_gpus, const LineError& fail) {
  if (job.gpus < 1) fail("gpus", "expected an integer >= 1, got " + std::to_string(job.gpus));
  if (job.min_gpus < 1 || job.min_gpus > job.gpus) {
    fail("min_gpus", "expected 1 <= min_gpus <= gpus (" + std::to_string(job.gpus) + "), got " +
                         std::to_string(job.min_gpus));
  }
  if (job.max_gpus < job.gpus) {
    fail("max_gpus", "expected max_gpus >= gpus (" + std::to_string(job.gpus) + "), got " +
                         std::to_string(job.max_gpus));
  }
  if (job.max_gpus > cluster_gpus) {
    fail(job.max_gpus == job.gpus ? "gpus" : "max_gpus",
         "the job asks for " + std::to_string(job.max_gpus) + " GPUs, more than the cluster's " +
             std::to_string(cluster_gpus));
  }
}

void read_batches(const json& o, Job& job, const LineError& fail) {
  if (o.contains("batch")) {
    job.batch = integer(o, "batch", fail, 0);
    if (job.batch < 1) fail("batch", "expected an integer >= 1, got " + o["batch"].dump());
  }
  job.min_batch = integer(o, "min_batch", fail, job.batch);
  job.max_batch = integer(o, "max_batch", fail, job.batch);
  if (o.contains("noise_scale")) job.noise_scale = number(o, "noise_scale", fail, true);
  if (job.elastic_batch() && !o.contains("noise_scale")) {
    fail("noise_scale",
         "missing: an elastic batch (min_batch < max_batch) needs the gradient "
         "noise scale in samples (docs/cluster.md)");
  }
}

/// Checks the batch bounds once the base batch is known (given, or the experiment's).
void check_batches(const Job& job, const LineError& fail) {
  if (job.batch == 0) {
    if (job.min_batch != 0 || job.max_batch != 0) {
      fail("batch",
           "missing: give the base batch with min_batch and max_batch when the "
           "experiment is not loaded");
    }
    return;
  }
  if (job.min_batch < 1 || job.min_batch > job.batch) {
    fail("min_batch", "expected 1 <= min_batch <= batch (" + std::to_string(job.batch) + "), got " +
                          std::to_string(job.min_batch));
  }
  if (job.max_batch < job.batch) {
    fail("max_batch", "expected max_batch >= batch (" + std::to_string(job.batch) + "), got " +
                          std::to_string(job.max_batch));
  }
}

Job parse_job(const std::string& line_text, const LineError& fail, int cluster_gpus) {
  json o;
  try {
    o = json::parse(line_text);
  } catch (const json::parse_error& e) {
    fail("", std::string("not JSON (one job object per line is expected): ") + e.what());
  }
  if (!o.is_object()) fail("", "expected a JSON object (one job per line)");
  for (const auto& [key, value] : o.items()) {
    if (!known_fields().count(key)) fail(key, "unknown field");
  }
  Job job;
  job.line = fail.line;
  job.id = text(o, "id", fail);
  if (job.id.find_first_of(",\"\n\r") != std::string::npos) {
    fail("id", "expected no comma, quote or line break (ids are CSV cells), got " + o["id"].dump());
  }
  job.arrival_s = number(o, "arrival_s", fail, true);
  if (job.arrival_s > kMaxTraceSeconds) {
    fail("arrival_s", "expected at most " + std::to_string(static_cast<long>(kMaxTraceSeconds)) +
                          " s (the simulator's clock, int64 picoseconds, spans about 106 days)");
  }
  job.experiment = text(o, "experiment", fail);
  job.experiment_file = study::resolve_experiment(job.experiment);
  job.samples = samples_of(o, fail);
  if (!o.contains("gpus")) fail("gpus", "missing (an integer is expected)");
  job.gpus = integer(o, "gpus", fail, 0);
  job.min_gpus = integer(o, "min_gpus", fail, job.gpus);
  job.max_gpus = integer(o, "max_gpus", fail, job.gpus);
  job.priority = integer(o, "priority", fail, 0);
  check_gpus(job, cluster_gpus, fail);
  read_batches(o, job, fail);
  return job;
}

/// Loads the job's experiment; returns its global batch.
int check_experiment(const Job& job, const LineError& fail) {
  try {
    const auto batch = strategies::load_experiment(job.experiment_file).training.global_batch;
    return static_cast<int>(std::min<std::int64_t>(batch, 1'000'000'000));
  } catch (const config::ConfigError& e) {
    fail("experiment", "\"" + job.experiment + "\" does not load: " + e.what());
  } catch (const study::BadInput& e) {
    fail("experiment", "\"" + job.experiment + "\" does not load: " + e.what());
  }
}

/// A job without a given base batch takes its experiment's (its bounds, when not given, too).
void default_batch(Job& job, int experiment_batch) {
  if (job.batch != 0) return;
  job.batch = experiment_batch;
  if (job.min_batch == 0) job.min_batch = job.batch;
  if (job.max_batch == 0) job.max_batch = job.batch;
}

bool skipped(const std::string& line) {
  const auto first = line.find_first_not_of(" \t\r");
  return first == std::string::npos || line[first] == '#';
}

}  // namespace

double Job::efficiency(int at_batch) const {
  if (batch <= 0 || at_batch == batch) return 1.0;
  return statistical_efficiency(noise_scale, batch, at_batch);
}

JobTrace parse_trace(std::istream& in, const std::string& source, int cluster_gpus,
                     bool check_experiments) {
  JobTrace trace;
  trace.source = source;
  std::set<std::string> ids;
  std::map<std::string, int> batches;  // experiment -> its global batch
  std::string line;
  for (int number_of_line = 1; std::getline(in, line); ++number_of_line) {
    if (skipped(line)) continue;
    const LineError fail{source, number_of_line};
    Job job = parse_job(line, fail, cluster_gpus);
    if (!ids.insert(job.id).second) fail("id", "\"" + job.id + "\" appears twice");
    if (check_experiments) {
      auto known = batches.find(job.experiment);
      if (known == batches.end()) {
        known = batches.emplace(job.experiment, check_experiment(job, fail)).first;
      }
      default_batch(job, known->second);
    }
    check_batches(job, fail);
    trace.jobs.push_back(std::move(job));
  }
  if (trace.jobs.empty()) throw study::BadInput(source + ": no jobs (one JSON object per line)");
  return trace;
}

JobTrace read_trace(const std::filesystem::path& file, int cluster_gpus, bool check_experiments) {
  std::ifstream in(file);
  if (!in) throw study::BadInput(file.string() + ": cannot open the trace");
  return parse_trace(in, file.string(), cluster_gpus, check_experiments);
}

}  // namespace stratasim::cluster
