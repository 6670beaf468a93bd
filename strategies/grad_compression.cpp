#include "strategies/grad_compression.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace stratasim::strategies {

std::string_view name_of(GradCompressionKind k) {
  switch (k) {
    case GradCompressionKind::none:
      return "none";
    case GradCompressionKind::fp16:
      return "fp16";
    case GradCompressionKind::int8:
      return "int8";
    case GradCompressionKind::topk:
      return "topk";
    case GradCompressionKind::s2_reducer:
      return "s2-reducer";
  }
  return "?";
}

std::optional<GradCompressionKind> grad_compression_from_name(std::string_view name) {
  for (GradCompressionKind k : kAllGradCompressions) {
    if (name_of(k) == name) return k;
  }
  return std::nullopt;
}

std::int64_t sparse_elements(double density, std::int64_t elements) {
  const auto k = static_cast<std::int64_t>(std::ceil(density * static_cast<double>(elements)));
  return std::max<std::int64_t>(1, std::min(k, elements));
}

namespace {

SyncStep compute_step(std::string what, Kernel kernel, Bytes buffer_delta = Bytes(0)) {
  SyncStep s;
  s.compute = true;
  s.kernels.push_back(std::move(kernel));
  s.what = std::move(what);
  s.buffer_delta = buffer_delta;
  return s;
}

SyncStep collective_step(std::string what, CollectiveKind kind, DType dtype, Bytes bytes) {
  SyncStep s;
  s.compute = false;
  s.collective = kind;
  s.dtype = dtype;
  s.bytes = bytes;
  s.what = std::move(what);
  return s;
}

Kernel elementwise(std::string name, std::int64_t elements, std::int64_t read,
                   std::int64_t written) {
  return Kernel{Elementwise{elements, Bytes(read), Bytes(written)}, std::move(name)};
}

}  // namespace

std::int64_t block_quantized_bytes(std::int64_t elements, int bits, std::int64_t block) {
  if (elements <= 0) return 0;
  const std::int64_t b = std::max<std::int64_t>(1, block);
  return (elements * bits + 7) / 8 + 4 * ((elements + b - 1) / b);
}

Kernel qwz_quantize_kernel(std::int64_t elements, DType dtype) {
  return elementwise("param.quantize_int8", elements, elements * size_of(dtype),
                     zeropp_quantized_bytes(elements, 8));
}

std::int64_t qwz_gathered_bytes(std::int64_t elements, int pieces) {
  const std::int64_t n = std::max(1, pieces);
  return n * zeropp_quantized_bytes((elements + n - 1) / n, 8);
}

Kernel qwz_dequantize_kernel(std::int64_t elements, int pieces, DType dtype) {
  return elementwise("param.dequantize_int8", elements, qwz_gathered_bytes(elements, pieces),
                     elements * size_of(dtype));
}

CompressedSync qgz_sync(std::int64_t elements, int node_ranks, int nodes, DType dtype) {
  const std::int64_t N = elements, g = size_of(dtype);
  const std::int64_t L = std::max(1, node_ranks), M = std::max(1, nodes);
  const std::int64_t per_node = (N + L - 1) / L, shard = (N + L * M - 1) / (L * M);
  const std::int64_t q1 = zeropp_quantized_bytes(N, 4), q2 = zeropp_quantized_bytes(per_node, 4);
  const std::string tag = " (qgZ int4)";
  CompressedSync sync;
  auto& steps = sync.steps;
  steps.push_back(
      compute_step("quantize", elementwise("grad.qgz_quantize_int4", N, N * g, q1), Bytes(2 * q1)));
  if (L > 1) {
    SyncStep intra = collective_step("intra-node all-to-all" + tag, CollectiveKind::all_to_all,
                                     DType::fp8, Bytes(q1));
    intra.group = SyncGroup::node;
    steps.push_back(std::move(intra));
    steps.push_back(compute_step("reduce",
                                 elementwise("grad.qgz_reduce_int4", N, q1, M > 1 ? q2 : shard * g),
                                 Bytes(M > 1 ? 2 * q2 : 0)));
  }
  if (M > 1) {
    const std::int64_t sent = L > 1 ? q2 : q1;
    SyncStep inter = collective_step("inter-node all-to-all" + tag, CollectiveKind::all_to_all,
                                     DType::fp8, Bytes(sent));
    inter.group = SyncGroup::cross_node;
    steps.push_back(std::move(inter));
    steps.push_back(compute_step(
        "dequantize and reduce",
        elementwise("grad.qgz_dequantize_reduce", L > 1 ? per_node : N, sent, shard * g)));
  }
  // The quantised buffers are freed when the last step ends.
  steps.back().buffer_delta -= Bytes(2 * q1 + (L > 1 && M > 1 ? 2 * q2 : 0));
  return sync;
}

CompressedSync compressed_sync(const GradCompression& c, std::int64_t elements, int ranks,
                               DType dtype) {
  if (!(c.density > 0.0 && c.density <= 1.0)) {
    throw std::invalid_argument("gradient compression density must be in (0, 1]");
  }
  if (!(c.sketch_ratio > 0.0)) {
    throw std::invalid_argument("gradient compression sketch_ratio must be positive");
  }
  const std::int64_t N = elements, e = size_of(dtype), n = std::max(1, ranks);
  const std::string tag = " (compressed " + std::string(name_of(c.kind)) + ")";
  CompressedSync sync;
  auto& steps = sync.steps;
  switch (c.kind) {
    case GradCompressionKind::none:
      throw std::invalid_argument("compressed_sync: no compression to model");
    case GradCompressionKind::fp16: {
      // Cast to fp16, all-reduce, cast back (PyTorch DDP's fp16_compress_hook).
      const std::int64_t half = 2 * N;
      steps.push_back(
          compute_step("compress", elementwise("grad.to_fp16", N, N * e, half), Bytes(half)));
      steps.push_back(collective_step("all-reduce" + tag, CollectiveKind::all_reduce, DType::fp16,
                                      Bytes(half)));
      steps.push_back(
          compute_step("decompress", elementwise("grad.from_fp16", N, half, N * e), Bytes(-half)));
      break;
    }
    case GradCompressionKind::int8: {
      // n chunks of c elements, each 1 byte plus an fp32 scale: all-to-all of every chunk to
      // its owner, local reduce and requantise of the owned chunk, all-gather of the results.
      const std::int64_t chunk = (N + n - 1) / n;
      // What each rank sends and receives: n chunks of chunk + 4 bytes.
      const std::int64_t payload = n * block_quantized_bytes(chunk, 8, chunk);
      steps.push_back(compute_step("compress", elementwise("grad.quantize_int8", N, N * e, payload),
                                   Bytes(2 * payload)));
      steps.push_back(collective_step("all-to-all" + tag, CollectiveKind::all_to_all, DType::fp8,
                                      Bytes(payload)));
      steps.push_back(
          compute_step("reduce", elementwise("grad.reduce_int8", n * chunk, payload, chunk + 4)));
      steps.push_back(collective_step("all-gather" + tag, CollectiveKind::all_gather, DType::fp8,
                                      Bytes(payload)));
      steps.push_back(compute_step("decompress",
                                   elementwise("grad.dequantize_int8", N, payload, N * e),
                                   Bytes(-2 * payload)));
      break;
    }
    case GradCompressionKind::topk: {
      // Select k values (with the error-feedback residual added, which keeps the rest), gather
      // every rank's values and int32 indices, scatter-add them into the dense gradient.
      const std::int64_t k = sparse_elements(c.density, N);
      const std::int64_t sent = k * (e + 4);
      steps.push_back(compute_step("compress",
                                   elementwise("grad.topk_select", N, 2 * N * e, N * e + sent),
                                   Bytes((n + 1) * sent)));
      steps.push_back(collective_step("all-gather" + tag, CollectiveKind::all_gather, DType::fp8,
                                      Bytes(n * sent)));
      steps.push_back(compute_step("decompress",
                                   elementwise("grad.topk_scatter_add", N, n * sent, N * e),
                                   Bytes(-(n + 1) * sent)));
      sync.residual = Bytes(N * e);
      break;
    }
    case GradCompressionKind::s2_reducer: {
      // A one-row count sketch of the non-zeros (fp32 counters) and a bitmap of their
      // positions, both all-reduced; recovery queries the sketch at the set bits.
      const std::int64_t nonzeros = sparse_elements(c.density, N);
      const auto columns = std::max<std::int64_t>(
          1, static_cast<std::int64_t>(std::ceil(c.sketch_ratio * static_cast<double>(nonzeros))));
      const std::int64_t sketch = 4 * columns, bitmap = (N + 7) / 8;
      steps.push_back(compute_step("compress",
                                   elementwise("grad.s2_sketch", N, N * e, sketch + bitmap),
                                   Bytes(sketch + bitmap)));
      steps.push_back(collective_step("sketch all-reduce" + tag, CollectiveKind::all_reduce,
                                      DType::fp32, Bytes(sketch)));
      steps.push_back(collective_step("bitmap all-reduce" + tag, CollectiveKind::all_reduce,
                                      DType::fp8, Bytes(bitmap)));
      steps.push_back(compute_step("decompress",
                                   elementwise("grad.s2_unsketch", N, sketch + bitmap, N * e),
                                   Bytes(-(sketch + bitmap))));
      break;
    }
  }
  return sync;
}

}  // namespace stratasim::strategies
