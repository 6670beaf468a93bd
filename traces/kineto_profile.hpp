// Calibration from a PyTorch profiler (Kineto) trace: the measured device profile
// (hw_models/profile.hpp) that the kernels of a user's own recorded job imply, for
// `stratasim calibrate --from-trace TRACE.json --device DEVICE`, so that a user without the CUDA
// back end can calibrate from a trace of their own job. docs/calibration.md ("Calibrating from
// a PyTorch profiler trace") is the user's page.
//
// The trace must hold GPU kernels (ProfilerActivity.CUDA) linked to the CPU operators that
// launched them (ProfilerActivity.CPU) with the operators' shapes (record_shapes=True: the args
// "Input Dims", "Input type", and "Concrete Inputs" for attention's is_causal).
//
// Linking. A kernel (cat "kernel") names the CPU operator that was innermost when it was
// launched by its args "External id", as Kineto links them; a kernel without one is linked by
// its "correlation" to the cuda_runtime (cuda_driver, hip_runtime) launch call, whose
// "External id" names the operator. CPU operators nest by time on their thread. A kernel belongs
// to one *call*:
//  - the outermost GEMM or attention operator among its operator and the operators enclosing
//    it (aten::linear > aten::matmul > aten::mm is one call of aten::linear, with its shapes;
//    aten::_scaled_dot_product_flash_attention > aten::_flash_attention_forward one call of
//    the former), else
//  - the innermost memory-bound operator among them (aten::to > aten::_to_copy > aten::copy_
//    is one call of aten::copy_).
// A call's duration is the sum of its kernels' durations (gaps between them excluded).
//
// The figures, each a field the profile already has:
//  - gemm rows: per (m, n, k, batch, dtype) the lower median (hw::lower_median) of its calls'
//    durations, written as the row's "time". Shapes are the operands' logical dims, so a
//    transposed operand (weight.t(), a strided view) needs nothing:
//      aten::mm(A[m,k], B[k,n]), aten::addmm(C, A[m,k], B[k,n]), aten::_scaled_mm(A[m,k], B[k,n]),
//      aten::bmm(A[b,m,k], B[b,k,n]), aten::baddbmm(C, A[b,m,k], B[b,k,n]),
//      aten::matmul(A[..., m, k], B[..., k, n]): batch = the product of the broadcast leading
//        dims; a 2-D B folds A's leading dims into m, as PyTorch does,
//      aten::linear(input[..., k], weight[n, k], bias): m = the product of input's leading dims.
//    The dtype is A's "Input type": c10::BFloat16 bf16, c10::Half fp16, float fp32 (TF32 is not
//    in the trace: fp32 GEMMs above the fp32 peak are noted), c10::Float8_* fp8.
//  - attention[dtype]: the sum of the calls' FLOPs over the sum of their durations, FLOPs as
//    the cost model counts them (strategies::attention_flops: 4 b h s_q s_kv d forward, twice
//    that backward, a causal kernel its unmasked share): the rate that makes the model predict
//    the recorded calls' total time. Operators (PyTorch's native_functions.yaml):
//    aten::_scaled_dot_product_{flash,efficient,cudnn}_attention (q, k as [b, h, s, d]),
//    their _backward (flash and efficient), aten::_flash_attention_{forward,backward} and
//    aten::_efficient_attention_{forward,backward} (q, k as [b, s, h, d]); is_causal (or
//    custom_mask_type != 0) from "Concrete Inputs". Variable-length (cum_seq) calls are skipped.
//  - elementwise_bandwidth: the sum of bytes over the sum of durations of the memory-bound
//    calls moving at least `min_memory_bytes` (smaller ones are launch- and latency-bound).
//    Bytes: every tensor input read, plus the output written: out-of-place maps (add, mul,
//    gelu, softmax, their backward, ...) write the broadcast shape of their tensor inputs in
//    the widest of their dtypes; norms (layer_norm, native_layer_norm) write their input's
//    shape and dtype; in-place ops (add_, mul_, ...) write their first input; copy_, fill_ and
//    zero_ do not read their first input.
//  - memory_bandwidth: device-to-device memcpys ("Memcpy DtoD") of at least min_memory_bytes:
//    2 x bytes (read and written, as `stratasim calibrate` counts a copy) / time, summed.
//  - copy_bandwidth: pinned host <-> device memcpys ("Memcpy HtoD (Pinned -> Device)",
//    "Memcpy DtoH (Device -> Pinned)") of at least min_memory_bytes: bytes / time, summed;
//    pageable copies are skipped (they are staged through a bounce buffer).
//  - kernel_launch_overhead: the lower median of the launch calls' durations (cuda_runtime
//    cudaLaunchKernel, cudaLaunchKernelExC, cudaLaunchCooperativeKernel; cuda_driver
//    cuLaunchKernel, cuLaunchKernelEx; ROCm's hip_runtime hipLaunchKernel, ...): issuing kernels
//    back to back, the host gives the GPU at most one kernel per launch call, which is what a
//    kernel that does (almost) nothing costs, the quantity `stratasim calibrate` measures.
// NCCL kernels are not fitted: their durations include waiting for the other ranks.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "hw_models/device.hpp"
#include "hw_models/profile.hpp"
#include "hw_models/units.hpp"

namespace stratasim::traces {

struct TraceCalibrationOptions {
  /// Memory-bound calls and memcpys moving fewer bytes are left out of the bandwidths.
  Bytes min_memory_bytes{std::int64_t{16} << 20};
  /// Written as the profile's date (ISO 8601); the CLI passes today's.
  std::string date;
};

/// What a trace gave: the profile and, for the user, what was used and what skipped.
struct TraceCalibration {
  hw::DeviceProfile profile;  // validated
  std::string gpu;            // deviceProperties[0].name, when the trace has it
  std::int64_t kernels = 0;   // GPU kernels, memcpys and memsets in the trace
  std::int64_t gemm_calls = 0, attention_calls = 0, elementwise_calls = 0, copies = 0;
  std::int64_t launches = 0;  // launch calls the launch overhead is the median of
  /// Calls (or kernels, launches) left out, by "<class>: <reason>".
  std::map<std::string, std::int64_t> skipped;
  /// Figures that look wrong for the device (a GEMM above its peak, ...), one line each.
  std::vector<std::string> notes;
};

/// Fits a profile for `device` (its name becomes the profile's device) from the Kineto trace
/// `file`. Throws TraceError (traces/import.hpp) naming the file and the JSON path: not JSON,
/// not a Chrome trace, no GPU kernels, kernels not linked to CPU operators, operators without
/// shapes ("record the trace with record_shapes=True"), nothing to fit.
TraceCalibration calibrate_from_kineto(const std::filesystem::path& file,
                                       const hw::DeviceSpec& device,
                                       const TraceCalibrationOptions& options = {});
/// The same from a trace's text in memory; `name` names it in errors.
TraceCalibration calibrate_from_kineto_text(const std::string& name, const std::string& text,
                                            const hw::DeviceSpec& device,
                                            const TraceCalibrationOptions& options = {});

}  // namespace stratasim::traces
