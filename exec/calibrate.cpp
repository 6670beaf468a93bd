#include "exec/calibrate.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <stdexcept>
#include <utility>

#include "exec/host_device.hpp"
#include "exec/interpreter.hpp"
#include "exec/plan.hpp"
#include "hw_models/cluster.hpp"
#include "strategies/program.hpp"

namespace stratasim::exec {

namespace {

using strategies::Attention;
using strategies::Collective;
using strategies::CollectiveKind;
using strategies::Compute;
using strategies::Copy;
using strategies::Elementwise;
using strategies::Gemm;
using strategies::Kernel;
using strategies::MemoryTier;
using strategies::OpId;
using strategies::OpInfo;
using strategies::Program;

constexpr std::int64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

/// The lower median (hw::lower_median); an empty list is a bug here.
Time median(std::vector<Time> values) {
  if (values.empty()) throw std::logic_error("calibrate: no timings to take the median of");
  return hw::lower_median(std::move(values));
}

/// At least one picosecond, so that rates stay finite.
Time positive(Time t) {
  return std::max(t, Time::ps(1));
}

Bandwidth bandwidth_of(Bytes bytes, Time t) {
  return Bandwidth(static_cast<double>(bytes.count()) / positive(t).seconds());
}

std::string shape_name(const GemmShape& s) {
  return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
}

/// Runs a measurement Program once after the options' warm-up; a failure names `what`.
MeasuredRun measure(const Program& program, const CalibrateOptions& options,
                    const std::string& what) {
  try {
    const ExecPlan plan(program);
    auto world = make_world(options.kind, plan, options.world);
    RunOptions run_options;
    run_options.warmup_iterations = options.warmup;
    run_options.iterations = 1;
    return exec::run(plan, *world, run_options);
  } catch (const ExecError& e) {
    throw ExecError("calibrate: " + what + ": " + e.what());
  }
}

/// A Program on rank 0 alone whose items are ops of one or more kernels, run once and timed
/// kernel by kernel.
class SingleRankRun {
 public:
  explicit SingleRankRun(std::string what) : what_(std::move(what)), program_(1) {
    program_.begin_rank(0);
  }

  /// `reps` ops of one kernel each; returns the item's index.
  std::size_t repeat(const Kernel& kernel, int reps) {
    const std::uint32_t list = program_.add_kernels({kernel});
    std::vector<OpId> ops;
    for (int i = 0; i < reps; ++i) ops.push_back(add(list, kernel.name));
    items_.push_back(std::move(ops));
    return items_.size() - 1;
  }

  /// One op of `kernels`, back to back; returns the item's index.
  std::size_t sequence(std::vector<Kernel> kernels) {
    const std::string label = kernels.empty() ? "empty" : kernels.front().name;
    const std::uint32_t list = program_.add_kernels(std::move(kernels));
    items_.push_back({add(list, label)});
    return items_.size() - 1;
  }

  void run(const CalibrateOptions& options) {
    program_.finish();
    const MeasuredRun measured = measure(program_, options, what_);
    for (const KernelTiming& k : measured.kernels) by_op_[k.op].push_back(k);
    for (auto& [op, list] : by_op_) {
      std::sort(list.begin(), list.end(),
                [](const KernelTiming& a, const KernelTiming& b) { return a.index < b.index; });
    }
  }

  /// The timings of the item's kernels, op by op and in each op in order.
  std::vector<KernelTiming> kernels(std::size_t item) const {
    std::vector<KernelTiming> out;
    for (OpId op : items_[item]) {
      const auto it = by_op_.find(op);
      if (it == by_op_.end()) {
        throw ExecError("calibrate: " + what_ + ": the device reported no kernel times for op " +
                        std::to_string(op));
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
    return out;
  }

  /// The median kernel duration of an item.
  Time median_duration(std::size_t item) const {
    std::vector<Time> durations;
    for (const KernelTiming& k : kernels(item)) durations.push_back(k.end - k.start);
    return median(durations);
  }

 private:
  OpId add(std::uint32_t list, std::string_view label) {
    OpInfo info;
    info.stream = strategies::Stream::compute;
    info.label = label;
    return program_.add(Compute{list}, info);
  }

  std::string what_;
  Program program_;
  std::vector<std::vector<OpId>> items_;
  std::map<OpId, std::vector<KernelTiming>> by_op_;
};

struct Sizes {
  Bytes copy;             // device -> device
  std::int64_t elements;  // elementwise
  Bytes host_copy;        // host <-> device
  Attention attention;    // dtype, causal and direction set per measurement
};

Sizes sizes_for(DeviceKind kind, bool quick) {
  Sizes s;
  if (kind == DeviceKind::cuda) {
    s.copy = Bytes(quick ? 256 * MiB : 1 * GiB);
    s.elements = quick ? 32 * 1024 * 1024 : 128 * 1024 * 1024;
    s.host_copy = Bytes(quick ? 64 * MiB : 256 * MiB);
    s.attention =
        quick ? Attention{1, 8, 8, 1024, 1024, 128} : Attention{2, 16, 16, 2048, 2048, 128};
  } else {
    s.copy = Bytes(quick ? 4 * MiB : 32 * MiB);
    s.elements = quick ? 1024 * 1024 : 4 * 1024 * 1024;
    s.host_copy = Bytes(quick ? 4 * MiB : 16 * MiB);
    s.attention = quick ? Attention{1, 1, 1, 64, 64, 32} : Attention{1, 2, 2, 128, 128, 64};
  }
  return s;
}

std::string description_of(const CalibrateOptions& options) {
  if (!options.description.empty()) return options.description;
  if (options.kind == DeviceKind::cuda) return cuda_description();
  return "CPU threads, naive float kernels (exec/host_kernels.hpp)";
}

void check(const CalibrateOptions& options, int reps) {
  if (options.ranks < 1) {
    throw std::invalid_argument("calibrate: expected 1 or more ranks, got " +
                                std::to_string(options.ranks));
  }
  if (reps < 1) {
    throw std::invalid_argument("calibrate: expected 1 or more repetitions, got " +
                                std::to_string(reps));
  }
  if (options.warmup < 0) {
    throw std::invalid_argument("calibrate: expected 0 or more warm-up runs, got " +
                                std::to_string(options.warmup));
  }
  for (const GemmShape& s : options.gemm_shapes) {
    if (s.m < 1 || s.n < 1 || s.k < 1) {
      throw std::invalid_argument("calibrate: GEMM shape " + shape_name(s) +
                                  ": expected positive dimensions");
    }
    if (options.kind == DeviceKind::host && s.m * s.n * s.k > kHostKernelLimit) {
      throw std::invalid_argument(
          "calibrate: GEMM shape " + shape_name(s) + " has " + std::to_string(s.m * s.n * s.k) +
          " multiply-adds, beyond the host device's limit of " + std::to_string(kHostKernelLimit));
    }
  }
  for (Bytes b : options.sizes) {
    if (b < Bytes(16 * options.ranks)) {
      throw std::invalid_argument("calibrate: collective size " + to_string(b) +
                                  " is below 16 bytes per rank");
    }
  }
}

void say(std::ostream* progress, const std::string& line) {
  if (progress != nullptr) *progress << line << '\n' << std::flush;
}

void measure_gemms(const CalibrateOptions& options, int reps, hw::DeviceProfile& profile,
                   std::ostream* progress) {
  const std::vector<GemmShape> shapes =
      options.gemm_shapes.empty() ? gemm_shapes(options.kind, options.quick) : options.gemm_shapes;
  for (DType dtype : options.dtypes) {
    SingleRankRun run("gemm " + std::string(name_of(dtype)));
    std::vector<std::size_t> items;
    for (const GemmShape& s : shapes) {
      items.push_back(run.repeat(Kernel{Gemm{s.m, s.n, s.k, 1, dtype}, "calibrate.gemm"}, reps));
    }
    run.run(options);
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      hw::GemmMeasurement g;
      g.m = shapes[i].m;
      g.n = shapes[i].n;
      g.k = shapes[i].k;
      g.dtype = dtype;
      g.time = positive(run.median_duration(items[i]));
      say(progress, "gemm " + std::string(name_of(dtype)) + " " + shape_name(shapes[i]) + ": " +
                        to_string(g.time) + " (" + to_string(g.rate()) + ")");
      profile.gemm.push_back(g);
    }
  }
}

void measure_attention(const CalibrateOptions& options, int reps, const Sizes& sizes,
                       hw::DeviceProfile& profile, std::ostream* progress) {
  for (DType dtype : options.dtypes) {
    SingleRankRun run("attention " + std::string(name_of(dtype)));
    Attention forward = sizes.attention;
    forward.causal = true;
    forward.dtype = dtype;
    forward.backward = false;
    Attention backward = forward;
    backward.backward = true;
    const Kernel fwd{forward, "calibrate.attention"};
    const Kernel bwd{backward, "calibrate.attention.bwd"};
    const std::size_t f = run.repeat(fwd, reps);
    const std::size_t b = run.repeat(bwd, reps);
    run.run(options);
    const Time t = positive(run.median_duration(f) + run.median_duration(b));
    const double flops = strategies::attention_flops(forward).count() +
                         strategies::attention_flops(backward).count();
    const FlopRate rate(flops / t.seconds());
    profile.attention[static_cast<std::size_t>(dtype)] = rate;
    say(progress, "attention " + std::string(name_of(dtype)) + ": forward + backward " +
                      to_string(t) + " (" + to_string(rate) + ")");
  }
}

void measure_memory(const CalibrateOptions& options, int reps, const Sizes& sizes,
                    hw::DeviceProfile& profile, std::ostream* progress) {
  SingleRankRun run("memory and launches");
  std::vector<Kernel> tiny(static_cast<std::size_t>(kLaunchKernels),
                           Kernel{Elementwise{1, Bytes(2), Bytes(2)}, "calibrate.launch"});
  const std::size_t launch = run.sequence(std::move(tiny));
  const std::size_t copy = run.repeat(
      Kernel{Copy{sizes.copy, MemoryTier::device, MemoryTier::device}, "calibrate.copy"}, reps);
  const std::int64_t e = sizes.elements;
  const Bytes read(4 * e), written(2 * e);
  const std::size_t elementwise =
      run.repeat(Kernel{Elementwise{e, read, written}, "calibrate.elementwise"}, reps);
  const std::size_t h2d = run.repeat(
      Kernel{Copy{sizes.host_copy, MemoryTier::host, MemoryTier::device}, "calibrate.h2d"}, reps);
  const std::size_t d2h = run.repeat(
      Kernel{Copy{sizes.host_copy, MemoryTier::device, MemoryTier::host}, "calibrate.d2h"}, reps);
  run.run(options);

  const auto tiny_kernels = run.kernels(launch);
  std::vector<Time> intervals;
  for (std::size_t i = 1; i < tiny_kernels.size(); ++i) {
    intervals.push_back(tiny_kernels[i].start - tiny_kernels[i - 1].start);
  }
  profile.kernel_launch_overhead = std::max(Time::zero(), median(intervals));
  say(progress, "kernel launch overhead: " + to_string(*profile.kernel_launch_overhead));

  profile.memory_bandwidth = bandwidth_of(sizes.copy * 2, run.median_duration(copy));
  say(progress,
      "memory bandwidth (" + to_string(sizes.copy) +
          " device-to-device copy, read and written): " + to_string(*profile.memory_bandwidth));
  profile.elementwise_bandwidth = bandwidth_of(read + written, run.median_duration(elementwise));
  say(progress, "elementwise bandwidth (" + std::to_string(e) +
                    " elements, read and written): " + to_string(*profile.elementwise_bandwidth));
  profile.host_to_device_bandwidth = bandwidth_of(sizes.host_copy, run.median_duration(h2d));
  profile.device_to_host_bandwidth = bandwidth_of(sizes.host_copy, run.median_duration(d2h));
  say(progress, "copy bandwidth (" + to_string(sizes.host_copy) + "): host to device " +
                    to_string(*profile.host_to_device_bandwidth) + ", device to host " +
                    to_string(*profile.device_to_host_bandwidth));
}

void measure_collectives(const CalibrateOptions& options, int reps, hw::DeviceProfile& profile,
                         std::ostream* progress) {
  const int n = options.ranks;
  std::vector<Bytes> sizes =
      options.sizes.empty() ? collective_sizes(options.kind, options.quick) : options.sizes;
  const std::int64_t unit = 16 * static_cast<std::int64_t>(n);
  for (Bytes& s : sizes) s = Bytes(s.count() / unit * unit);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());

  Program program(n);
  std::vector<std::int32_t> members(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) members[static_cast<std::size_t>(r)] = r;
  const std::uint32_t group = program.add_group(members, "calibrate");
  constexpr std::size_t kKinds = strategies::kCollectiveKindCount;
  // Per (kind, size): the first op's index within each rank's ops; repetitions follow.
  std::vector<std::pair<std::size_t, Bytes>> items;
  for (std::size_t k = 0; k < kKinds; ++k) {
    for (Bytes s : sizes) items.emplace_back(k, s);
  }
  for (int r = 0; r < n; ++r) {
    program.begin_rank(r);
    for (const auto& [k, s] : items) {
      for (int i = 0; i < reps; ++i) {
        OpInfo info;
        info.stream = strategies::Stream::dp_comm;
        info.label = strategies::kCollectiveTraits[k].config_name;
        program.add(Collective{static_cast<CollectiveKind>(k), DType::bf16, group, s}, info);
      }
    }
  }
  program.finish();
  const MeasuredRun measured =
      measure(program, options, "collectives over " + std::to_string(n) + " ranks");
  const auto& spans = measured.timeline.spans;
  for (std::size_t item = 0; item < items.size(); ++item) {
    std::vector<Time> times;
    for (int i = 0; i < reps; ++i) {
      const std::size_t index = item * static_cast<std::size_t>(reps) + static_cast<std::size_t>(i);
      Time shortest = Time::infinity();
      for (int r = 0; r < n; ++r) {
        const OpId id = program.first_op(r) + static_cast<OpId>(index);
        if (id >= spans.size())
          throw ExecError("calibrate: the run reported no span of op " + std::to_string(id));
        shortest = std::min(shortest, spans[id].end - spans[id].start);
      }
      times.push_back(shortest);
    }
    hw::CollectiveMeasurementRow row;
    row.kind = static_cast<std::uint8_t>(items[item].first);
    row.ranks = n;
    row.bytes = items[item].second;
    row.time = positive(median(times));
    say(progress, std::string(strategies::kCollectiveTraits[row.kind].config_name) + " over " +
                      std::to_string(n) + " ranks, " + to_string(row.bytes) + ": " +
                      to_string(row.time));
    profile.collectives.push_back(row);
  }
}

}  // namespace

int default_repetitions(DeviceKind kind) {
  return kind == DeviceKind::cuda ? 20 : 5;
}

std::vector<GemmShape> gemm_shapes(DeviceKind kind, bool quick) {
  std::vector<std::int64_t> grid;
  if (kind == DeviceKind::cuda) {
    grid = quick ? std::vector<std::int64_t>{1024, 4096}
                 : std::vector<std::int64_t>{512, 1024, 2048, 4096, 8192};
  } else {
    grid = quick ? std::vector<std::int64_t>{32, 64} : std::vector<std::int64_t>{64, 128, 256};
  }
  std::vector<GemmShape> shapes;
  auto add = [&](GemmShape s) {
    if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
  };
  for (std::int64_t m : grid) {
    for (std::int64_t n : grid) {
      for (std::int64_t k : grid) add({m, n, k});
    }
  }
  if (kind == DeviceKind::cuda) {
    // A transformer layer over t tokens with hidden size h: QKV (3h), attention projection,
    // MLP up (4h) and down; forward (t rows) and weight gradients (reducing over t).
    const std::int64_t t = 4096;
    for (std::int64_t h :
         quick ? std::vector<std::int64_t>{4096} : std::vector<std::int64_t>{4096, 8192}) {
      for (GemmShape s : {GemmShape{t, 3 * h, h}, GemmShape{t, h, h}, GemmShape{t, 4 * h, h},
                          GemmShape{t, h, 4 * h}, GemmShape{h, 3 * h, t}, GemmShape{h, h, t},
                          GemmShape{h, 4 * h, t}, GemmShape{4 * h, h, t}}) {
        add(s);
      }
    }
  }
  return shapes;
}

std::vector<Bytes> collective_sizes(DeviceKind kind, bool quick) {
  if (kind == DeviceKind::cuda) {
    if (quick) return {Bytes(1 * MiB), Bytes(16 * MiB), Bytes(256 * MiB)};
    std::vector<Bytes> sizes;
    for (std::int64_t s = 64 * KiB; s <= 1 * GiB; s *= 4) sizes.push_back(Bytes(s));
    return sizes;
  }
  if (quick) return {Bytes(4 * KiB), Bytes(64 * KiB)};
  return {Bytes(4 * KiB), Bytes(64 * KiB), Bytes(1 * MiB)};
}

std::string utc_date_today() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &utc);
  return buf;
}

hw::DeviceProfile calibrate(const CalibrateOptions& options, std::ostream* progress) {
  const int reps =
      options.repetitions == 0 ? default_repetitions(options.kind) : options.repetitions;
  check(options, reps);
  hw::DeviceProfile profile;
  profile.device =
      options.device_name.empty() ? std::string(name_of(options.kind)) : options.device_name;
  profile.date = utc_date_today();
  profile.source = "stratasim calibrate, " + std::string(name_of(options.kind)) + ", " +
                   description_of(options) + ", " + std::to_string(reps) + " repetitions";
  const Sizes sizes = sizes_for(options.kind, options.quick);
  say(progress, "calibrating " + profile.device + " (" + profile.source + ")");
  measure_memory(options, reps, sizes, profile, progress);
  measure_gemms(options, reps, profile, progress);
  measure_attention(options, reps, sizes, profile, progress);
  if (options.ranks > 1) measure_collectives(options, reps, profile, progress);
  profile.validate();
  return profile;
}

hw::DeviceProfile calibrate(DeviceKind kind, const CalibrateOptions& options,
                            std::ostream* progress) {
  CalibrateOptions o = options;
  o.kind = kind;
  return calibrate(o, progress);
}

}  // namespace stratasim::exec
