// The kernel measurements of the published calibration set (tests/reference/calibration.json:
// GEMM throughput at exact shapes, fused-attention throughput series) as kernels this project
// can cost, each with its measured duration. `stratasim calibrate --fit` fits kernel models to
// them (study/fit.hpp) and `stratasim accuracy --kernels` compares predictions with them.
//
// How a case becomes kernels:
// - "gemm": one strategies::Gemm. Shapes as the source prints them: ml-engineering's mamf table
//   "best_shape_printed" M x N x K (its notes: "treat the order as printed"), DeepGEMM's m, n, k,
//   and its grouped GEMMs as `groups` GEMMs of m_per_group x n x k (a batched GEMM). dtype bf16,
//   or fp8 for "fp8..." rows. Measured time = 2 m n k batch / measured TFLOP/s.
// - "attention_kernel": each point of the series is one case (id "<case>@<seqlen>"): a
//   strategies::Attention of (batch, nheads, seqlen, headdim, causal) in fp16, forward, backward
//   or both (pass "fwd", "bwd", "fwd+bwd"), of the fused implementation named by the series'
//   kernel (FlashAttention, FlashAttention-2, FlashAttention-3, cuDNN); other kernels (PyTorch,
//   xformers, Triton, standard attention) are not modelled kernels and are skipped. Measured
//   time = FLOPs as the benchmark counts them (4 b s^2 h d, halved when causal, x2.5 backward,
//   x3.5 forward + backward) / measured TFLOP/s.
// A case is matched to a device by its "hardware.gpu" among the device's published_names.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw_models/device.hpp"
#include "strategies/program.hpp"

namespace stratasim::study {

struct KernelCase {
  std::string id;      // the case's id (attention: "<case id>@<seqlen>")
  std::string source;  // its source's id ("ml-engineering-mamf", ...)
  std::string gpu;     // hardware.gpu as printed
  std::string
      series;  // what it belongs to for plots: "gemm bf16", "flash-attention-2 fwd causal hd128"
  bool attention = false;
  std::vector<strategies::Kernel> kernels;  // run back to back
  double measured_seconds = 0;              // their measured duration
  double published_tflops = 0;              // the rate as the source prints it
  double flops = 0;                         // FLOPs as the source counts them
};

/// Every kernel case of the calibration document `doc` that the project can express; cases it
/// cannot (another kind of kernel, a null measurement) are appended to `skipped` as
/// "<id>: <reason>". Throws config::ConfigError naming `file` and the dotted JSON path of a
/// malformed case ("cases.3.config.m").
std::vector<KernelCase> kernel_cases(const nlohmann::json& doc, const std::string& file,
                                     std::vector<std::string>* skipped = nullptr);

/// The cases measured on `device` (hardware.gpu among device.published_names).
std::vector<KernelCase> cases_for(const std::vector<KernelCase>& cases,
                                  const hw::DeviceSpec& device);

/// Reads a calibration file (JSON with "cases"); config::ConfigError when it cannot.
nlohmann::json load_calibration(const std::string& file);

}  // namespace stratasim::study
