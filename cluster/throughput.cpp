#include "cluster/throughput.hpp"

#include <stdexcept>

#include "hw_models/config_reader.hpp"
#include "strategies/experiment.hpp"
#include "study/catalog.hpp"
#include "study/errors.hpp"
#include "study/study.hpp"

namespace stratasim::cluster {

Speed TableThroughput::speed(const Job& job, int gpus, int batch) const {
  const bool base = batch == 0 || batch == job.batch;
  if (base) {
    if (const auto e = table_.find(job.experiment); e != table_.end()) {
      if (const auto g = e->second.find(gpus); g != e->second.end() && g->second > 0) {
        return {true, g->second, ""};
      }
    }
  }
  if (const auto e = batched_.find(job.experiment); e != batched_.end()) {
    const auto g = e->second.find({gpus, base ? job.batch : batch});
    if (g != e->second.end() && g->second > 0) return {true, g->second, ""};
  }
  if (!table_.count(job.experiment) && !batched_.count(job.experiment)) {
    return {false, 0, "no speeds for " + job.experiment};
  }
  return {false, 0,
          "no speed for " + job.experiment + " at " + std::to_string(gpus) + " GPUs" +
              (base ? std::string() : ", batch " + std::to_string(batch))};
}

namespace {

Speed not_runnable(int gpus, const std::string& why) {
  return {false, 0, "not runnable at " + std::to_string(gpus) + " GPUs: " + why};
}

}  // namespace

Speed simulate_speed(const std::filesystem::path& experiment_file, int gpus, int batch) {
  strategies::Experiment experiment;
  try {
    const strategies::Experiment base = strategies::load_experiment(experiment_file);
    std::vector<strategies::Override> overrides = study::resize_overrides(base.cluster, gpus);
    overrides.push_back({"parallelism.dp", nullptr, "cluster (dp from the GPUs)"});
    if (batch > 0) {
      overrides.push_back({"training.global_batch", batch, "cluster (the job's batch)"});
    }
    experiment = strategies::load_experiment(experiment_file, overrides);
  } catch (const config::ConfigError& e) {
    return not_runnable(gpus, e.what());
  } catch (const std::invalid_argument& e) {
    return not_runnable(gpus, e.what());
  }
  study::Options options;
  // As `stratasim simulate` runs it, keeping no memory samples and the spans of the stages'
  // first ranks only (the report's figures cover every rank whatever is kept).
  options.record_memory = false;
  options.spans_of_traced_ranks_only = true;
  options.trace_ranks = "stages";
  study::Result result;
  try {
    result = study::simulate(std::move(experiment), options);
  } catch (const study::BadInput& e) {  // among them HostMemoryExceeded
    return not_runnable(gpus, e.what());
  }
  if (!result.timeline.completed) return not_runnable(gpus, "the simulation did not complete");
  if (!result.report.fits) return not_runnable(gpus, "does not fit in device memory");
  if (!(result.report.samples_per_s > 0)) return not_runnable(gpus, "no samples per second");
  return {true, result.report.samples_per_s, ""};
}

Speed SimulatedThroughput::speed(const Job& job, int gpus, int batch) const {
  const std::lock_guard<std::mutex> lock(mutex_);
  const auto key = std::make_tuple(job.experiment_file.string(), gpus, batch);
  if (const auto hit = cache_.find(key); hit != cache_.end()) return hit->second;
  ++simulations_;
  return cache_.emplace(key, simulate_speed(job.experiment_file, gpus, batch)).first->second;
}

int SimulatedThroughput::simulations() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return simulations_;
}

}  // namespace stratasim::cluster
