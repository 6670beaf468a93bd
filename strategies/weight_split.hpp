// Zero Bubble's split backward as a pass over a stage plan: the weight-gradient work of each
// backward segment moves into a weight pass W that a schedule may run later than the
// input-gradient pass B (Qi et al., Zero Bubble Pipeline Parallelism, ICLR 2024).
#pragma once

#include "strategies/transformer.hpp"

namespace stratasim::strategies {

/// True for kernels that compute weight gradients: names ending in ".wgrad" (the transformer
/// and layer-table lowerings name them so) and the embedding tables' gradients
/// ("embedding.grad", "embedding.position_grad").
bool is_weight_gradient(const Kernel& kernel);

/// Bytes a weight-gradient kernel reads that B would otherwise free: for a GEMM dW = X^T dY its
/// two operands, (m k + k n) * batch * dtype size (the stored input X and the output gradient
/// dY); for other kernels the bytes they read. Per layer of a transformer this gives Zero
/// Bubble's M_W = 32 s b h (2-byte dtype, no tensor parallelism).
Bytes weight_gradient_operand_bytes(const Kernel& kernel);

/// The plan with its backward split: every backward compute segment with weight-gradient
/// kernels keeps the others (B) and a W segment (same label + " W", layers and chain) takes
/// them, with the segment's grads_done. B keeps the W operands stored (its activation_delta
/// grows by weight_grad_bytes, or the operand bytes when that is 0) and W releases them.
/// Collectives stay in B. A plan already split (weight not empty) is returned as it is.
StagePlan split_backward(StagePlan plan);

}  // namespace stratasim::strategies
