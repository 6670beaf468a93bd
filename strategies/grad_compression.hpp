// Compressed data-parallel gradient synchronisation (parallelism.grad_compression): what one
// gradient bucket's synchronisation runs instead of a dense all-reduce, as a sequence of compute
// steps (compression and decompression kernels on the compute stream) and collectives over the
// data-parallel group (dp-comm stream). docs/grad-compression.md gives the volume formulas and
// their sources. Tensor and pipeline parallel traffic is untouched.
//
// With N elements of e bytes in the bucket (e: the training dtype, what the dense all-reduce
// sends) and n ranks, the per-rank traffic of a ring is:
// - none:  all-reduce of N e bytes:                             2 (n-1)/n N e
// - fp16:  all-reduce of 2N bytes:                              2 (n-1)/n 2N
// - int8:  DeepSpeed's compressed all-reduce (1-bit Adam, ZeRO++'s qgZ): each rank quantises
//          its bucket in n chunks of c = ceil(N/n) elements with one fp32 scale each, exchanges
//          them by all-to-all, dequantises and sums the chunk it owns, requantises it and
//          all-gathers the result:                               2 (n-1) (c + 4) ~ 2 (n-1)/n N
// - topk:  k = ceil(density N) values and their int32 indices all-gathered, then every rank
//          scatter-adds the n k entries (error feedback keeps what was not sent):
//                                                               (n-1) k (e + 4)
// - s2-reducer (Ge et al., S2 Reducer, arXiv:2110.02140): the non-zero gradients (density N
//          of them) hashed into a one-row count sketch of C = ceil(sketch_ratio density N) fp32
//          counters and an N-bit bitmap of their positions, both all-reduced, then every rank
//          reads its gradient back from the sketch at the bitmap's positions:
//                                                               2 (n-1)/n (4 C + ceil(N/8))
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "strategies/program.hpp"

namespace stratasim::strategies {

enum class GradCompressionKind : std::uint8_t { none, fp16, int8, topk, s2_reducer };
inline constexpr GradCompressionKind kAllGradCompressions[] = {
    GradCompressionKind::none, GradCompressionKind::fp16, GradCompressionKind::int8,
    GradCompressionKind::topk, GradCompressionKind::s2_reducer};
/// "none", "fp16", "int8", "topk", "s2-reducer".
std::string_view name_of(GradCompressionKind k);
std::optional<GradCompressionKind> grad_compression_from_name(std::string_view name);

struct GradCompression {
  GradCompressionKind kind = GradCompressionKind::none;
  /// topk and s2-reducer: the fraction of a bucket's elements that is sent (top-k's k / N; the
  /// non-zero fraction S2 Reducer sketches), in (0, 1].
  double density = 0.01;
  /// s2-reducer: count-sketch counters per non-zero element (the reference implementation's
  /// `rank`, 1 by default): C = ceil(sketch_ratio * density * N) counters.
  double sketch_ratio = 1.0;

  bool operator==(const GradCompression&) const = default;
  bool enabled() const { return kind != GradCompressionKind::none; }
};

/// The group a step's collective runs on: the data-parallel group, or for qgZ's hierarchy the
/// rank's node group (its node's data-parallel ranks) or its cross-node group (the ranks of
/// the other nodes at the same place in theirs).
enum class SyncGroup : std::uint8_t { data_parallel, node, cross_node };

/// One step of a bucket's compressed synchronisation.
struct SyncStep {
  bool compute = true;
  std::vector<Kernel> kernels;  // compute steps
  CollectiveKind collective = CollectiveKind::all_reduce;
  DType dtype = DType::bf16;  // collective payload (fp8 stands for any 1-byte payload)
  Bytes bytes;                // collective size as nccl-tests counts it
  std::string what;           // label suffix: "compress", "all-gather (compressed topk)", ...
  SyncGroup group = SyncGroup::data_parallel;  // where the collective runs
  /// comm_buffers allocated when the step starts (> 0) or released when it ends (< 0).
  Bytes buffer_delta;
};

struct CompressedSync {
  std::vector<SyncStep> steps;
  /// Error feedback kept between iterations (topk: the gradient left unsent), on the device as
  /// gradients for as long as training runs.
  Bytes residual;
};

/// Bytes of `elements` values block-quantised to `bits` bits (packed) with one fp32 scale per
/// block of at most `block` elements: ceil(elements bits / 8) + 4 ceil(elements / block).
/// int8's chunks above are blocks of a whole chunk: chunk + 4.
std::int64_t block_quantized_bytes(std::int64_t elements, int bits, std::int64_t block);

/// ZeRO++'s quantisation block (Wang et al., arXiv:2306.10209, block-based quantisation):
/// DeepSpeed's CUDAQuantizer (partition_parameters.py) picks groups of at most
/// target_group_size = 8000 elements for qwZ. qgZ's swizzled quantiser uses a group per
/// matrix row (a few thousand elements); the same block is used for it (the scales are under
/// 0.2% of the bytes either way).
inline constexpr std::int64_t kZeroppBlock = 8000;
/// block_quantized_bytes with ZeRO++'s block.
inline std::int64_t zeropp_quantized_bytes(std::int64_t elements, int bits) {
  return block_quantized_bytes(elements, bits, kZeroppBlock);
}
/// qwZ's kernels (memory-bound, costed as elementwise kernels): quantising `elements` weights
/// of `dtype` to int8 (reads e N, writes zeropp_quantized_bytes(N, 8)), and dequantising the
/// `pieces` gathered pieces of a unit of N weights (reads pieces x zeropp_quantized_bytes(
/// ceil(N / pieces), 8), writes e N).
Kernel qwz_quantize_kernel(std::int64_t elements, DType dtype);
Kernel qwz_dequantize_kernel(std::int64_t elements, int pieces, DType dtype);
/// Bytes of the `pieces` int8 pieces of a unit of N weights: pieces x
/// zeropp_quantized_bytes(ceil(N / pieces), 8).
std::int64_t qwz_gathered_bytes(std::int64_t elements, int pieces);

/// ZeRO++'s qgZ (DeepSpeed's all_to_all_quant_reduce, coalesced_collectives.py): a bucket of
/// N gradients of `dtype` (g bytes each) over dp = node_ranks x nodes ranks, L = node_ranks:
///   quantise   int4, q1 = zeropp_quantized_bytes(N, 4), send and receive buffers 2 q1
///   all-to-all q1 bytes over the node group                 (L > 1 only)
///   reduce     dequantise the L chunks, sum, requantise the rank's N / L to int4:
///              q2 = zeropp_quantized_bytes(ceil(N / L), 4), buffers 2 q2
///   all-to-all q2 bytes over the cross-node group           (nodes > 1 only)
///   dequantise and reduce the nodes' chunks into the shard: ceil(N / dp) g bytes written
/// The collectives carry DType::fp8 (a 1-byte payload) and say which group they run on.
/// Per rank: (L-1)/L q1 + (nodes-1)/nodes q2 bytes sent, ~N/2 (L-1)/L + N/(2L) (nodes-1)/nodes
/// against the reduce-scatter's (dp-1)/dp N g.
CompressedSync qgz_sync(std::int64_t elements, int node_ranks, int nodes, DType dtype);

/// k of top-k (and S2 Reducer's non-zeros): ceil(density * elements), at least 1.
std::int64_t sparse_elements(double density, std::int64_t elements);

/// The steps that synchronise a bucket of `elements` gradients of `dtype` over `ranks` ranks
/// under `compression` (not none). Throws std::invalid_argument for none, a density outside
/// (0, 1] or a sketch ratio <= 0.
CompressedSync compressed_sync(const GradCompression& compression, std::int64_t elements, int ranks,
                               DType dtype);

}  // namespace stratasim::strategies
