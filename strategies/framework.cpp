#include "strategies/framework.hpp"

namespace stratasim::strategies {

std::string_view name_of(Framework f) {
  switch (f) {
    case Framework::generic:
      return "generic";
    case Framework::megatron:
      return "megatron";
    case Framework::deepspeed:
      return "deepspeed";
    case Framework::fsdp:
      return "fsdp";
  }
  return "?";
}

std::optional<Framework> framework_from_name(std::string_view name) {
  for (Framework f : kAllFrameworks) {
    if (name_of(f) == name) return f;
  }
  return std::nullopt;
}

FrameworkDefaults framework_defaults(Framework framework, DType dtype, int zero_stage) {
  FrameworkDefaults d;
  d.grad_dtype = dtype;
  // A framework without end-to-end runs to fit (megatron, deepspeed) takes the generic
  // framework's fitted efficiency: the best estimate there is of kernels inside a training step.
  d.compute_efficiency = kGenericComputeEfficiency;
  d.elementwise_traffic = kGenericElementwiseTraffic;
  d.attention_efficiency = kGenericAttentionEfficiency;
  switch (framework) {
    case Framework::generic:
      // Fitted to the flash-attention repository's GPT-3 runs (PyTorch DDP, ZeRO-1 from 760M).
      break;
    case Framework::megatron:
      // bf16 forces accumulate_allreduce_grads_in_fp32; fp16 keeps fp16 main grads and the
      // optimizer's fp32 copy; fp32 is fp32 throughout.
      if (dtype == DType::fp16) {
        d.fp32_grad_copy = true;
      } else {
        d.grad_dtype = DType::fp32;
      }
      break;
    case Framework::deepspeed:
      // BF16_Optimizer (bf16 without ZeRO sharding) accumulates in fp32; ZeRO keeps t.
      if (dtype == DType::bf16 && zero_stage == 0) d.grad_dtype = DType::fp32;
      break;
    case Framework::fsdp:
      d.zero_stage = 3;  // FULL_SHARD
      // Fitted to llm-foundry's FSDP runs (Composer, PyTorch eager: unfused elementwise work).
      d.compute_efficiency = kFsdpComputeEfficiency;
      d.elementwise_traffic = kFsdpElementwiseTraffic;
      d.attention_efficiency = kFsdpAttentionEfficiency;
      break;
  }
  return d;
}

DieTraining die_training(std::string_view die) {
  if (die == "GH100") return kGH100Training;
  return {};
}

Bytes held_back_memory(Bytes cuda_context, Bytes nccl_buffers, int communicators) {
  return cuda_context + nccl_buffers * static_cast<std::int64_t>(communicators);
}

}  // namespace stratasim::strategies
