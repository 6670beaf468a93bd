// Bytes a kernel moves through memory, as the cost model (sim/cost.hpp) charges them and as
// exports (traces/chakra.hpp: a Chakra node's tensor_size) report them. One rule, one place:
// the cost model's memory times and the exports call these.
#pragma once

#include "hw_models/units.hpp"
#include "strategies/program.hpp"

namespace stratasim::strategies {

/// Bytes a GEMM moves through device memory: A (m x k), B (k x n) and C (m x n) once per batch,
/// packed (fp4: two elements a byte). The cost model's memory time (sim/cost.hpp).
Bytes gemm_memory_bytes(const Gemm& g);
/// Bytes a fused attention kernel moves: Q and O (batch x heads x seq_q x head_dim each), K and
/// V (batch x kv_heads x seq_kv x head_dim each); the backward pass also reads dO and writes dQ,
/// dK, dV: 5/2 times the forward's. The cost model's memory time (sim/cost.hpp).
Bytes attention_memory_bytes(const Attention& a);
/// Bytes any kernel moves, as the cost model charges them: the two above; an elementwise
/// kernel's bytes read plus written (before a device's framework_memory_traffic factor); an
/// optimizer step's update bytes (strategies/optimizer.hpp); a copy's bytes (twice within one tier:
/// read and write); RooflineWork's bytes; zero for measured kernels.
Bytes memory_bytes(const Kernel& k);

}  // namespace stratasim::strategies
