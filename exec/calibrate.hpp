// Calibration: measures on the present device(s) what the simulator's cost model needs and
// returns it as a device profile (hw_models/profile.hpp, schema version 2) for
// `stratasim calibrate --out PROFILE.json` to write with hw::write_profile. docs/calibration.md
// says what each figure is and how the simulator uses it.
//
// Every measurement is a tiny strategies::Program run for real with exec::run on the chosen
// device (exec/devices.hpp): `repetitions` compute ops of one kernel each on rank 0 (one
// Program per section: GEMMs of one dtype, attention of one dtype, memory and launch, copies),
// timed kernel by kernel (MeasuredRun::kernels); a figure is the median over the repetitions:
// - gemm: each shape of the grid (gemm_shapes) and dtype, the median kernel time, written as a
//   row's "time" (launch overhead excluded, as the cost model adds it);
// - kernel_launch_overhead: one op of kLaunchKernels 1-element elementwise kernels back to
//   back; the median interval between consecutive kernel starts (the tiny kernel's own run
//   plus the gap before the next one: what a kernel costs when it does nothing);
// - memory_bandwidth: a device-to-device Copy of S bytes, 2 S (read and written) / time;
// - elementwise_bandwidth: an Elementwise kernel of E elements reading 4 E bytes and writing
//   2 E (a residual add in bf16), 6 E / time;
// - attention per dtype: a causal forward and backward Attention kernel of seq_q = seq_kv,
//   (F_fwd + F_bwd) / (t_fwd + t_bwd) with F = strategies::matmul_flops x the causal share the
//   cost model applies (sim/cost.cpp: 1/2 when seq_q = seq_kv);
// - copy_bandwidth: Copy kernels of S bytes host -> device and device -> host, S / time;
// - collectives (ranks > 1): one Program on `ranks` ranks with one group of them all, each
//   kind at each size `repetitions` times back to back on the dp_comm stream; a repetition
//   takes the shortest of its members' spans (the last member to arrive waits least, so its
//   span is closest to the collective itself), a row the median over repetitions.
// The host device's figures describe its naive CPU kernels (exec/host_kernels.hpp): useful to
// test the tool and the profile's use, not to predict anything.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "exec/devices.hpp"
#include "hw_models/dtype.hpp"
#include "hw_models/profile.hpp"
#include "hw_models/units.hpp"

namespace stratasim::exec {

/// Kernels in the launch-overhead op.
inline constexpr int kLaunchKernels = 64;

/// A GEMM shape to measure: C[m, n] = A[m, k] B[k, n].
struct GemmShape {
  std::int64_t m = 0, n = 0, k = 0;
  bool operator==(const GemmShape&) const = default;
};

struct CalibrateOptions {
  DeviceKind kind = DeviceKind::host;
  /// Devices of this node that collectives are measured over (1: no collectives).
  int ranks = 1;
  /// Timed repetitions of every measurement; 0: the kind's default (5 host, 20 CUDA).
  int repetitions = 0;
  /// Untimed runs of every measurement Program before the timed one (cuBLAS heuristics, NCCL
  /// set-up, caches).
  int warmup = 1;
  /// Dtypes of the GEMM table and attention rates.
  std::vector<DType> dtypes = {DType::bf16, DType::fp16, DType::fp32};
  /// Fewer shapes and sizes: a quick look (and the tests).
  bool quick = false;
  /// Collective sizes; empty: the kind's defaults (collective_sizes). Each is rounded down to a
  /// multiple of 16 x ranks bytes, so that every member's shard is whole.
  std::vector<Bytes> sizes;
  /// GEMM shapes; empty: the kind's defaults (gemm_shapes).
  std::vector<GemmShape> gemm_shapes;
  /// Written as the profile's device: the DeviceSpec name the profile is for (the CLI passes
  /// the device config's name or the GPU's); empty: "host" or "cuda".
  std::string device_name;
  /// Said in the profile's source; empty: cuda_description() on CUDA, the host kernels on the
  /// host.
  std::string description;
  /// Passed to make_world (capacity per rank, launch mode, seed).
  WorldOptions world;
};

/// 5 on the host, 20 on CUDA.
int default_repetitions(DeviceKind kind);
/// The default GEMM grid. CUDA: every (m, n, k) of {512, 1024, 2048, 4096, 8192} (quick: of
/// {1024, 4096}) and transformer layers' shapes (QKV, projection, MLP up and down, forward and
/// weight-gradient) for hidden sizes 4096 and 8192 (quick: 4096) over 4096 tokens; host: every
/// (m, n, k) of {64, 128, 256} (quick: {32, 64}), all within kHostKernelLimit.
std::vector<GemmShape> gemm_shapes(DeviceKind kind, bool quick);
/// The default collective sizes. CUDA: 64 KiB to 1 GiB by factors of 4 (quick: 1 MiB, 16 MiB,
/// 256 MiB); host: 4 KiB, 64 KiB, 1 MiB (quick: 4 KiB, 64 KiB).
std::vector<Bytes> collective_sizes(DeviceKind kind, bool quick);

/// Measures the device(s) of `options.kind` and returns the profile (validated). Writes a line
/// per figure to `progress` when given. Throws ExecError (naming the measurement) when a run
/// fails, std::invalid_argument for options out of range (ranks < 1, repetitions < 0, a host
/// GEMM shape beyond kHostKernelLimit, ...).
hw::DeviceProfile calibrate(const CalibrateOptions& options, std::ostream* progress = nullptr);
/// The same on devices of `kind` (options.kind is ignored).
hw::DeviceProfile calibrate(DeviceKind kind, const CalibrateOptions& options,
                            std::ostream* progress = nullptr);

/// Today's date in UTC, ISO 8601 ("2025-06-30").
std::string utc_date_today();

}  // namespace stratasim::exec
