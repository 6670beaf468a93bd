// A calibrated kernel model of one device: the few parameters of the shape-aware GEMM and
// fused-attention cost formulas (sim/cost.hpp), fitted to published kernel measurements
// (tests/reference/calibration.json) by `stratasim calibrate --fit` (study/fit.hpp;
// scripts/fit-profiles re-runs it for the shipped devices). docs/gemm-efficiency.md says what each
// parameter means physically and how it is fitted.
//
// GEMM, per dtype (fp16 and bf16 share one tensor-core datapath: a dtype without parameters uses
// the other's):
//   efficiency(m, n, k) = peak_fraction x tile quantisation x wave factor x k_s / (k_s +
//   k_overhead) time = max(FLOPs / (peak x efficiency), bytes / achievable bandwidth) + latency
// - peak_fraction: the share of the datasheet peak the main loop of a large, well-shaped GEMM
//   sustains (clocks under load, issue and memory stalls);
// - k_overhead: the prologue and epilogue of an output tile (filling the pipeline, writing C)
//   expressed as elements of k of main loop: a GEMM with k = k_overhead spends half its time
//   outside the main loop;
// - wave factor = 1 - wave_loss x (1 - tiles / (waves x units)): how much of the last wave's idle
//   units is lost; 1 for kernels that run tiles in waves, 0 for persistent (stream-K) kernels
//   that balance the remainder over all units (CUTLASS 3 / cuBLAS on Hopper);
// - latency: what a kernel takes beyond its work (grid ramp-up, the first loads' DRAM latency,
//   the tail), which dominates small, memory-bound GEMMs; launch overhead is apart;
// - when the output tiles do not fill the compute units, the library splits k over s units
//   (split-K, s chosen to minimise time, k_s = k / s), as cuBLAS's heuristics do.
// Block-scaled FP8 (fp8-block, DeepGEMM's kernels) is costed instead as DeepGEMM runs the shape
// (DeepGemmModel, deepgemm_launch, deepgemm_seconds): its own choice of tiles, waves and
// pipeline stages, the tiles' main loop and per-tile epilogue, and the DRAM stream, overlapped.
//
// Fused attention, per implementation (FlashAttention 1, 2, 3, cuDNN) and dtype-independent
// (16-bit inputs):
//   rate = peak(dtype) x fraction(direction) x head_dim_factor(d) x s / (s + s_half)
// - forward / backward: the share of peak at long sequences with head dimension 128, backward
//   FLOPs counted as the cost model counts them (2x the forward, while FlashAttention's backward
//   runs 5 matmuls, 2.5x: the fraction absorbs it);
// - seq_half / causal_seq_half: the sequence length (keys per query) at which per-block overheads
//   halve the rate, without and with a causal mask, at head dimension 128. A causal kernel also
//   wastes the masked part of the tiles that straddle the diagonal: per query, half the
//   implementation's diagonal span (causal_diagonal_span: kBlockM + kBlockN - gcd of its tiles,
//   which differ with the head dimension); the causal excess causal_seq_half - seq_half scales
//   with that span relative to head dimension 128's;
// - head_dim: factors at head dimensions 64 and 256 relative to 128, interpolated in ln d
//   (clamped outside).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "hw_models/config_reader.hpp"
#include "hw_models/dtype.hpp"

namespace stratasim::hw {

/// Fused attention implementations the calibrated model distinguishes.
enum class AttentionImpl : std::uint8_t {
  flash_attention,    // FlashAttention (v1, 2022)
  flash_attention_2,  // FlashAttention-2 (2023): the default
  flash_attention_3,  // FlashAttention-3 (2024, Hopper)
  cudnn,              // cuDNN's fused attention (Transformer Engine's default on Hopper)
  /// FlashAttention in Triton (Tri Dao's flash_attn_triton.py, 2022, on the pre-MLIR Triton):
  /// what MosaicML's llm-foundry/MPT runs with attn_impl: triton. Its speed barely depends on the
  /// head dimension (FlashAttention-2 paper, fig. 4-5, "FlashAttention Triton").
  flash_attention_triton,
};
inline constexpr AttentionImpl kAllAttentionImpls[] = {
    AttentionImpl::flash_attention, AttentionImpl::flash_attention_2,
    AttentionImpl::flash_attention_3, AttentionImpl::cudnn, AttentionImpl::flash_attention_triton};
/// "flash-attention", "flash-attention-2", "flash-attention-3", "cudnn",
/// "flash-attention-triton".
std::string_view name_of(AttentionImpl impl);
std::optional<AttentionImpl> attention_impl_from_name(std::string_view name);

/// The diagonal span of a causal kernel (tokens): kBlockM + kBlockN - gcd(kBlockM, kBlockN) of the
/// query x key tile `impl` runs at `head_dim` (rounded up to the next head dimension it is
/// compiled for; a larger one takes 256's) in the given direction. A query tile's last key tile
/// straddles the diagonal; with the round-up of the key range to whole key tiles its rows compute,
/// on average, span / 2 masked keys each (span = the tile when kBlockN divides kBlockM; the
/// backward, which walks query tiles for each key tile, likewise). The tiles are the kernels'
/// own launch choices (FlashAttention's source, Dao-AILab/flash-attention):
/// - FlashAttention-2 (csrc/flash_attn/src/flash_{fwd,bwd}_launch_template.h, no dropout, sm80
///   and sm90): forward 128x128 to head dim 64, 128x64 to 192, 64x64 at 256 (on GPUs with 192 KB
///   or more shared memory per SM: the H100; the A100 runs 128x64 there, which this table does
///   not tell apart); backward 128x128 to 64, 64x128 to 128, 64x64 above;
/// - FlashAttention (v1, csrc/flash_attn/src/fmha_{fwd,bwd}_hdim*.cu before FlashAttention-2):
///   steps of 16 query rows over key blocks of 256 to head dim 64, 128 above;
/// - FlashAttention-3 (hopper/tile_size.h, causal; hopper/flash_bwd_launch_template.h, sm90):
///   forward 192x128 at 64, 192x144 at 96, 128x128 at 128, 128x112 at 192, 128x80 at 256;
///   backward 128x128 at 64, 64x128 at 96 and 128, 64x96 at 192, 64x80 at 256;
/// - FlashAttention in Triton (flash_attn/flash_attn_triton.py): 128x128 both ways;
/// - cuDNN: its tiles are not published: taken as 128x128 at every head dimension.
int causal_diagonal_span(AttentionImpl impl, double head_dim, bool backward);

/// How an FP8 GEMM's operands are scaled: the kernels differ, and so do their calibrated models.
enum class GemmScaling : std::uint8_t {
  /// One scale per tensor (cuBLASLt's FP8 GEMMs; Transformer Engine's delayed and current
  /// scaling; what torch._scaled_mm runs): the default.
  tensor,
  /// Per-block scales, 1x128 for activations and 128x128 for weights (DeepSeek-V3's recipe,
  /// DeepGEMM): the partial sums are rescaled in fp32 on the CUDA cores every 128 of k.
  block,
  /// Microscaling applied by the tensor cores themselves (Blackwell's block-scaled MMA): MXFP8
  /// (OCP MX v1.0: 32-element blocks along k, E8M0 scales) for fp8, NVFP4 (16-element blocks,
  /// E4M3 scales, one fp32 scale per tensor) for fp4, the only fp4 GEMM modelled.
  mx,
};
/// "tensor", "block", "mx".
std::string_view name_of(GemmScaling scaling);
std::optional<GemmScaling> gemm_scaling_from_name(std::string_view name);

/// The GEMM kernel classes a kernel model can hold: one per dtype (tensor-scaled; fp4 is
/// NVFP4), block-scaled FP8 (DeepGEMM) and MXFP8.
struct GemmClass {
  DType dtype;
  GemmScaling scaling;
  friend constexpr bool operator==(const GemmClass&, const GemmClass&) = default;
};
/// The kernel class of a GEMM of `dtype` with `scaling`: block and mx scaling are FP8's classes
/// (another dtype's scaling is its plain class: fp4's one class is NVFP4).
constexpr GemmClass gemm_class_of(DType dtype, GemmScaling scaling) {
  return {dtype, dtype == DType::fp8 ? scaling : GemmScaling::tensor};
}
inline constexpr GemmClass kGemmClasses[] = {
    {DType::fp32, GemmScaling::tensor}, {DType::tf32, GemmScaling::tensor},
    {DType::fp16, GemmScaling::tensor}, {DType::bf16, GemmScaling::tensor},
    {DType::fp8, GemmScaling::tensor},  {DType::fp8, GemmScaling::block},
    {DType::fp8, GemmScaling::mx},      {DType::fp4, GemmScaling::tensor}};

/// DeepGEMM's block-scaled FP8 kernel as it runs a shape (the fp8-block class), the parameters
/// beyond GemmModel's peak_fraction and latency. docs/gemm-efficiency.md derives each one; the
/// time formula is deepgemm_seconds below. JSON: "gemm": {"fp8-block": {..., "deepgemm": {...}}}.
struct DeepGemmModel {
  /// Share of the datasheet HBM bandwidth the kernel's TMA loads and stores reach, (0, 1].
  double memory_fraction = 0.9;
  /// How the SMs' tile work and the DRAM stream overlap: time = (compute^p + memory^p)^(1/p),
  /// p = overlap >= 1 (1: one after the other; large: the longer one hides the other).
  double overlap = 2;
  /// Seconds one round of the TMA pipeline takes (a load's loaded round trip from L2/HBM into
  /// shared memory): a tile's k loop cannot run faster than ceil(k / 128) / stages rounds.
  double load_latency = 1e-6;
  /// Seconds per output tile outside the main loop, not overlapped: the math warp-groups load
  /// the B scales (ceil(k / 128) floats from global memory) before, and store C through shared
  /// memory and a TMA store (waiting for it) after each tile.
  double tile_latency = 1e-6;
  /// The main loop's rate, relative to the unrolled one, when the B scales of a tile straddle
  /// two 128-row blocks and DeepGEMM does not unroll the choice (128 / gcd(128, block_n) > 4):
  /// a predicate per accumulator in the fp32 promotion on the CUDA cores. (0, 1].
  double predicated_promotion = 1;
};

struct GemmModel {
  double peak_fraction = 0.8;      // (0, 1]
  double k_overhead = 0;           // elements of k, >= 0
  double wave_loss = 1;            // share of the last wave's idle units that is lost, [0, 1]
  double latency = 0;              // seconds a GEMM kernel takes beyond its work, >= 0
  std::vector<std::string> cases;  // calibration cases it was fitted to (traceability)
  /// When set (the fp8-block class), the GEMM is costed as DeepGEMM runs it (deepgemm_seconds):
  /// k_overhead and wave_loss are unused, peak_fraction is the main loop's share of an SM's peak
  /// and latency the kernel's own (grid launch, first loads, tail).
  std::optional<DeepGemmModel> deepgemm;
};

/// DeepGEMM's launch configuration of a (grouped) block-scaled FP8 GEMM: what its JIT heuristic
/// get_best_configs picks (deepseek-ai/DeepGEMM 55ab91f, 2025-03-25,
/// deep_gemm/jit_kernels/gemm.py, the version whose README tables calibrate the class).
/// - block_m: 64 when m <= 64, else 128 (a grouped GEMM's m is the rows per group);
/// - block_n in {16, 24, ..., 128, 144, 160}: the fewest waves of tiles over the SMs, then the
///   fullest last wave, then the smallest block_n;
/// - stages: the most of 8..4 whose buffers fit 232,448 bytes of shared memory (only 4 when the
///   B scales straddle and the promotion is unrolled, 128 / gcd(128, block_n) <= 4);
/// - TMA multicast over 2 SMs (a cluster) when m >= 512, one group, and the operand's tiles pair
///   up (n % (2 block_n) == 0 for A, m % (2 block_m) == 0 for B; the larger block's side first);
/// - sms: the SMs launched, max(ceil(tiles / waves), SMs - 8), rounded up to the cluster size.
struct DeepGemmLaunch {
  int block_m = 128;
  int block_n = 128;
  int stages = 4;
  int multicast = 1;           // SMs sharing a TMA load (1 or 2)
  bool multicast_on_a = true;  // which operand's tile the cluster shares
  std::int64_t tiles = 0;      // groups x ceil(m / block_m) x ceil(n / block_n)
  std::int64_t waves = 0;      // ceil(tiles / SMs): tiles the busiest SM runs, one after another
  std::int64_t sms = 0;        // SMs launched (persistent CTAs)
  /// The B scales of a tile straddle two 128-row blocks and the promotion is not unrolled.
  bool predicated_promotion = false;
};
/// `groups` GEMMs of m x n x k (1 for a plain GEMM; DeepGEMM's masked grouped layout) on a GPU
/// of `sms` SMs. Dimensions must be positive.
DeepGemmLaunch deepgemm_launch(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t groups,
                               int sms);
/// Seconds DeepGEMM takes for `groups` GEMMs of m x n x k (FP8 A and B, 1x128 and 128x128 fp32
/// scales, bf16 C) on a GPU of `sms` SMs, `peak_flops` FLOP/s (FP8 dense) and `hbm` bytes/s:
///   tile    = max(2 block_m block_n k / (peak / sms x peak_fraction [x predicated_promotion]),
///                 ceil(k / 128) / stages x load_latency) + tile_latency
///   compute = waves x tile
///   memory  = groups (m k + n k + 2 m n + 4 m ceil(k / 128) + 4 ceil(n / 128) ceil(k / 128))
///             / (hbm x memory_fraction)
///   time    = (compute^p + memory^p)^(1/p) + latency,  p = overlap.
double deepgemm_seconds(const GemmModel& model, std::int64_t m, std::int64_t n, std::int64_t k,
                        std::int64_t groups, int sms, double peak_flops, double hbm);

struct AttentionModel {
  double forward = 0.5;        // share of peak, long sequences, head dim 128; (0, 1]
  double backward = 0.5;       // (0, 1]
  double seq_half = 0;         // tokens, >= 0
  double causal_seq_half = 0;  // tokens at head dim 128, >= 0 (see causal_half)
  double head_dim_64 = 1;      // factor at head dim 64 (relative to 128), > 0
  double head_dim_256 = 1;     // factor at head dim 256, > 0
  /// A causal kernel's rate at long sequences relative to a non-causal one's, > 0: the diagonal
  /// blocks' partly masked work and the uneven work of query blocks (later rows see more keys)
  /// that the kernel's scheduling does not even out.
  double causal_factor = 1;
  std::vector<std::string> cases;

  /// The fall-off's half point with a causal mask: seq_half + (causal_seq_half - seq_half) x
  /// causal_diagonal_span(impl, head_dim, backward) / causal_diagonal_span(impl, 128, backward),
  /// at least 0.
  double causal_half(AttentionImpl impl, bool backward, double head_dim) const;
  /// fraction(direction) x head_dim_factor(head_dim) x s / (s + s_half) x (causal_factor when
  /// causal), s = keys per query, s_half = seq_half or (causal) causal_half.
  double efficiency(AttentionImpl impl, bool backward, bool causal, double head_dim,
                    double keys) const;
};

struct KernelModel {
  static constexpr std::string_view kSchema = "stratasim-kernel-model";
  static constexpr int kSchemaVersion = 1;

  std::string device;  // DeviceSpec::name it was fitted for
  std::string source;  // how: the fit command and the calibration file
  std::array<std::optional<GemmModel>, std::size(kAllDTypes)> gemm{};
  /// Block-scaled FP8 GEMMs (GemmScaling::block): JSON "gemm": {"fp8-block": ...}.
  std::optional<GemmModel> gemm_fp8_block;
  /// MXFP8 GEMMs (GemmScaling::mx): JSON "gemm": {"fp8-mx": ...}.
  std::optional<GemmModel> gemm_fp8_mx;
  std::array<std::optional<AttentionModel>, std::size(kAllAttentionImpls)> attention{};
  /// Free-form fit statistics per block, kept for the reader (not used by the cost model).
  nlohmann::json fit = nlohmann::json::object();

  /// The GEMM parameters for `dtype` (fp16 <-> bf16 fall back on each other; block-scaled and
  /// MXFP8 fall back on tensor-scaled FP8 where they have no parameters of their own: Blackwell's
  /// tensor cores apply the MX scales inside the MMA at the dense FP8 rate; NVFP4 falls back on
  /// tensor-scaled FP8's, the same kernel structure at the FP4 peak: no FP4 GEMM is calibrated
  /// yet), or nullptr.
  const GemmModel* gemm_for(DType dtype, GemmScaling scaling = GemmScaling::tensor) const;
  /// The slot of a GEMM kernel class: gemm[dtype], or gemm_fp8_block / gemm_fp8_mx for block-
  /// and MX-scaled FP8 (a block scaling of another dtype is its plain class).
  std::optional<GemmModel>& gemm_slot(DType dtype, GemmScaling scaling);
  const std::optional<GemmModel>& gemm_slot(DType dtype, GemmScaling scaling) const;
  /// The JSON key of a GEMM kernel class: the dtype's name ("bf16"), "fp8-block" or "fp8-mx".
  static std::string gemm_key(DType dtype, GemmScaling scaling);
  const AttentionModel* attention_for(AttentionImpl impl) const;

  /// Checks ranges; throws config::ValidationError ("gemm.bf16.peak_fraction").
  void validate() const;
};

KernelModel read_kernel_model(const config::Document& doc, const std::string& path);
KernelModel load_kernel_model(const std::filesystem::path& file);
nlohmann::json to_json(const KernelModel& model);
void write_kernel_model(const KernelModel& model, const std::filesystem::path& file);

}  // namespace stratasim::hw
