// Writes PyTorch profiler (Kineto) traces with known kernels, for the tests of
// `stratasim calibrate --from-trace` (traces/kineto_profile.hpp) and its CLI.
//
// The events are laid out as torch.profiler's export_chrome_trace writes them (PyTorch 2.x with
// record_shapes=True): a CPU operator (cat "cpu_op") carries "External id", "Input Dims",
// "Input type" and "Concrete Inputs"; each kernel it launches is a cuda_runtime
// "cudaLaunchKernel" event inside the operator (same "External id", a "correlation") and a
// "kernel" event on the GPU (pid 0, tid = stream 7) with the same "External id" and
// "correlation". Operators nest by time on CPU thread 100 (pid 100).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace stratasim::testing {

class KinetoWriter {
 public:
  using json = nlohmann::json;

  /// Every launch call lasts this long (microseconds) unless changed.
  double launch_us = 5;
  /// false: record_shapes was off (no "Input Dims", "Input type", "Concrete Inputs").
  bool shapes = true;

  /// Opens an operator at the current CPU time; close() ends it. Operators opened inside
  /// enclose it (aten::linear > aten::addmm). Returns its External id.
  std::int64_t open(const std::string& name, json dims = json::array(), json types = json::array(),
                    json concrete = json::array()) {
    const std::int64_t id = next_id_++;
    json args = {{"External id", id}, {"Record function id", 0}};
    if (shapes) {
      args["Input Dims"] = std::move(dims);
      args["Input type"] = std::move(types);
      if (!concrete.empty()) args["Concrete Inputs"] = std::move(concrete);
    }
    open_.push_back({events_.size(), cpu_us_, id});
    events_.push_back({{"ph", "X"},
                       {"cat", "cpu_op"},
                       {"name", name},
                       {"pid", 100},
                       {"tid", 100},
                       {"ts", cpu_us_},
                       {"dur", 0},
                       {"args", args}});
    cpu_us_ += 1;
    return id;
  }
  void close() {
    cpu_us_ += 1;
    const Open o = open_.back();
    open_.pop_back();
    events_[o.event]["dur"] = cpu_us_ - o.ts;
    cpu_us_ += 1;
  }
  /// The innermost open operator launches a kernel of `us` microseconds. `by_external`: the
  /// kernel carries the "External id" (else only its "correlation" links it to the launch).
  void kernel(double us, const std::string& name = "kernel", bool by_external = true) {
    const std::int64_t external = open_.empty() ? 0 : open_.back().id;
    const std::int64_t correlation = next_correlation_++;
    events_.push_back({{"ph", "X"},
                       {"cat", "cuda_runtime"},
                       {"name", "cudaLaunchKernel"},
                       {"pid", 100},
                       {"tid", 100},
                       {"ts", cpu_us_},
                       {"dur", launch_us},
                       {"args", {{"External id", external}, {"correlation", correlation}}}});
    cpu_us_ += launch_us + 0.5;
    json args = {{"device", 0}, {"stream", 7}, {"correlation", correlation}};
    if (by_external) args["External id"] = external;
    events_.push_back({{"ph", "X"},
                       {"cat", "kernel"},
                       {"name", name},
                       {"pid", 0},
                       {"tid", 7},
                       {"ts", gpu_us_},
                       {"dur", us},
                       {"args", args}});
    gpu_us_ += us + 1;
  }
  /// One operator launching kernels of the given durations.
  void call(const std::string& name, json dims, json types, const std::vector<double>& kernels_us,
            json concrete = json::array()) {
    open(name, std::move(dims), std::move(types), std::move(concrete));
    for (double us : kernels_us) kernel(us);
    close();
  }
  /// A memcpy on the GPU ("Memcpy DtoD (Device -> Device)", ...) of `bytes`.
  void memcpy(const std::string& name, std::int64_t bytes, double us) {
    events_.push_back({{"ph", "X"},
                       {"cat", "gpu_memcpy"},
                       {"name", name},
                       {"pid", 0},
                       {"tid", 7},
                       {"ts", gpu_us_},
                       {"dur", us},
                       {"args", {{"device", 0}, {"stream", 7}, {"bytes", bytes}}}});
    gpu_us_ += us + 1;
  }
  /// An NCCL all-reduce kernel (not fitted).
  void nccl(double us) {
    events_.push_back({{"ph", "X"},
                       {"cat", "kernel"},
                       {"name", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"},
                       {"pid", 0},
                       {"tid", 20},
                       {"ts", gpu_us_},
                       {"dur", us},
                       {"args", {{"device", 0}, {"stream", 20}}}});
    gpu_us_ += us + 1;
  }

  json document() const {
    return {{"schemaVersion", 1},
            {"deviceProperties", json::array({{{"id", 0}, {"name", "NVIDIA H100 80GB HBM3"}}})},
            {"traceEvents", events_}};
  }
  std::string text() const { return document().dump(1); }

 private:
  struct Open {
    std::size_t event;
    double ts;
    std::int64_t id;
  };
  json events_ = json::array();
  std::vector<Open> open_;
  std::int64_t next_id_ = 1, next_correlation_ = 1000;
  double cpu_us_ = 1000, gpu_us_ = 1000;
};

}  // namespace stratasim::testing
