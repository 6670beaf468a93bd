// What frameworks do around the layers: the defaults a training framework sets for how model
// states are kept and reduced, and the device memory every framework holds back from the
// tensors. ONE table (framework_defaults); docs/frameworks.md explains each row with sources.
//
// training.framework picks a row; every field it sets can still be given alone in the
// experiment (training.grad_accumulation_dtype, training.distributed_optimizer,
// memory.reserved / memory.cuda_context / memory.nccl_buffers), and then wins.
//
// Rows (t is training.dtype):
// - generic: gradients in t, reduced in t; no fp32 gradient copy (ZeRO's 2 + 2 + 12 bytes).
// - megatron (Megatron-LM): bf16 (and fp32) training accumulates and all-reduces gradients in
//   fp32 main-grad buffers (megatron/training/arguments.py: "bfloat16 requires gradient
//   accumulation and all-reduce to be done in fp32" forces accumulate_allreduce_grads_in_fp32;
//   the DDP grad buffer then has dtype float32, and that buffer is what is all-reduced, or
//   reduce-scattered by the distributed optimizer); fp16 training keeps fp16 gradient buffers
//   and the optimizer an fp32 copy of them (Float16OptimizerWithFloat16Params), unless
//   --accumulate-allreduce-grads-in-fp32. Bytes per parameter as Megatron's table
//   (docs/source/api-guide/dist_optimizer.md): 20 (fp16), 18 (bf16 + fp32 grads), 16 (fp32);
//   distributed optimizer 4 + 16/d, 6 + 12/d, 8 + 8/d. The distributed optimizer is off unless
//   training.distributed_optimizer (--use-distributed-optimizer).
// - deepspeed: ZeRO stages 1-3 keep gradients in t and reduce them in t
//   (communication_data_type defaults to the model's dtype; the fp32 gradient partition exists
//   only inside the step), so ZeRO's 2 + 2 + 12; with bf16 and ZeRO stage 0 DeepSpeed's
//   BF16_Optimizer accumulates gradients in fp32 (data_types.grad_accum_dtype, default fp32:
//   DeepSpeed PR #4713), so 2 + 4 + 12.
// - fsdp (PyTorch FSDP, MixedPrecision(param_dtype=t, reduce_dtype=t)): gradients reduced in t,
//   no separate fp32 gradient buffer. The sharded parameters are fp32 and are the master copy:
//   4 + 4 + 8 bytes per sharded parameter, the same 16/d as ZeRO-3's 2 + 2 + 12 over d, so it is
//   modelled as ZeRO stage 3 (parallelism.zero defaults to 3 with fsdp: FULL_SHARD).
//
// Held back on every device (memory breakdown `other`, reported but never allocated by ops):
//   cuda_context + nccl_buffers x communicators of the rank
// - cuda_context, 512 MiB: the CUDA context with PyTorch's kernels and cuBLAS/cuDNN handles.
//   Published figures range from about 300 MiB to 1 GiB depending on the GPU and CUDA version
//   (lazy module loading, CUDA_MODULE_LOADING=LAZY, the default since CUDA 11.7, keeps it near
//   the low end); PyTorch's docs note that the context is not counted by
//   torch.cuda.memory_allocated but occupies device memory.
// - nccl_buffers, 64 MiB per communicator: NCCL allocates NCCL_BUFFSIZE (4 MiB, the Simple
//   protocol's default) per channel for each ring neighbour it sends to and receives from;
//   with 8 channels 2 x 8 x 4 MiB = 64 MiB. NVLink systems often open 16 to 32 channels, so this
//   is a floor. A rank's communicators: the Program's groups of more than one member that hold
//   it, plus one per pipeline peer it sends to or receives from.
// - the allocator's fragmentation is memory.fragmentation (default 1: published figures vary
//   too widely to default, ZeRO-R reports out-of-memory with over 30% free in extreme cases).
#pragma once

#include <optional>
#include <string_view>

#include "hw_models/dtype.hpp"
#include "hw_models/units.hpp"

namespace stratasim::strategies {

enum class Framework { generic, megatron, deepspeed, fsdp };
inline constexpr Framework kAllFrameworks[] = {Framework::generic, Framework::megatron,
                                               Framework::deepspeed, Framework::fsdp};
std::string_view name_of(Framework f);
/// The framework called `name` ("megatron", ...), if any.
std::optional<Framework> framework_from_name(std::string_view name);

/// What a framework does by default, given the training dtype and the ZeRO stage.
struct FrameworkDefaults {
  DType grad_dtype = DType::bf16;  // gradient buffers: accumulated over microbatches, reduced
  bool fp32_grad_copy = false;     // the optimizer keeps an fp32 copy of 16-bit gradients
  bool distributed_optimizer = false;
  std::optional<int> zero_stage;  // a framework that shards by default (fsdp: 3)
  /// The framework's kernel efficiency inside a training step (TrainingSpec's
  /// compute_efficiency, elementwise_traffic): fitted by `stratasim fit --frameworks` to the
  /// calibration set's end-to-end runs of the framework (configs/frameworks.json, which a test
  /// holds these equal to); a framework without such runs (megatron, deepspeed) takes the
  /// generic framework's.
  double compute_efficiency = 1.0;
  double elementwise_traffic = 1.0;
  double attention_efficiency = 1.0;  // TrainingSpec's attention_efficiency
};
FrameworkDefaults framework_defaults(Framework framework, DType dtype, int zero_stage);

/// The fitted values of configs/frameworks.json (scripts/fit-profiles writes the file; copy its
/// figures here when they change: tests/reference/frameworks_test.cpp compares them).
inline constexpr double kGenericComputeEfficiency = 0.9321;
inline constexpr double kGenericElementwiseTraffic = 1.0;
inline constexpr double kFsdpComputeEfficiency = 0.8216;
inline constexpr double kFsdpElementwiseTraffic = 1.0531;
inline constexpr double kGenericAttentionEfficiency = 1.0;
inline constexpr double kFsdpAttentionEfficiency = 1.4921;

/// What a GPU die's kernels reach inside training steps, relative to the reference die's
/// (kReferenceDie): multiples of the calibrated kernel model's GEMM and fused-attention rates
/// (hw::DeviceEfficiency::die_gemm, die_attention). The kernel models are fitted to kernel
/// benchmarks (the best shape of a sweep, seconds-long runs); the end-to-end runs show how
/// much of that each die holds over a training step's shapes, clocks under sustained load and
/// kernels the calibration set does not measure on it (the H100's Triton attention is derived
/// from the A100's). The runs can only tell dies apart: every framework factor multiplies all
/// of them, so the die with the most runs is the reference and keeps 1. Fitted with the
/// frameworks by `stratasim fit --frameworks` (configs/frameworks.json "dies"; docs/frameworks.md).
struct DieTraining {
  double gemm = 1.0;
  double attention = 1.0;
};
inline constexpr std::string_view kReferenceDie = "GA100";
/// The fitted values of configs/frameworks.json "dies" (copy them here when they change).
inline constexpr DieTraining kGH100Training{.gemm = 0.8602, .attention = 1.1195};
/// The fitted factors of `die`; 1 and 1 for the reference die, an unfitted die or none ("").
DieTraining die_training(std::string_view die);

/// Device memory held back from the tensors (memory breakdown `other`).
inline constexpr Bytes kDefaultCudaContext = Bytes(512LL << 20);
inline constexpr Bytes kDefaultNcclBuffers = Bytes(64LL << 20);  // per communicator
/// cuda_context + nccl_buffers x communicators.
Bytes held_back_memory(Bytes cuda_context, Bytes nccl_buffers, int communicators);

}  // namespace stratasim::strategies
