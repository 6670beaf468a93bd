#include "exec/host_kernels.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

namespace stratasim::exec::host {

using namespace strategies;

namespace {

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;

std::int64_t bh_of(const Attention& a) {
  return a.batch * a.heads;
}

}  // namespace

std::int64_t work_size(const Kernel& kernel) {
  return std::visit(
      Overloaded{
          [](const Gemm& g) { return g.m * g.n * g.k * g.batch; },
          [](const Attention& a) {
            // QK^T and PV: 2 seq_q seq_kv d per (batch, head); backward about twice that.
            const std::int64_t f = 2 * bh_of(a) * a.seq_q * a.seq_kv * a.head_dim;
            return a.backward ? 2 * f : f;
          },
          [](const Elementwise& e) { return e.elements; },
          [](const OptimizerStep& o) { return o.params; },
          [](const Copy& c) { return c.bytes.count(); },
          [](const Measured&) { return std::int64_t{0}; },
          [](const RooflineWork& r) { return static_cast<std::int64_t>(r.flops.count() / 2); },
      },
      kernel.work);
}

std::int64_t scratch_floats(const Kernel& kernel) {
  return std::visit(
      Overloaded{
          [](const Gemm& g) { return (g.m * g.k + g.k * g.n + g.m * g.n) * g.batch; },
          [](const Attention& a) {
            const std::int64_t qo = bh_of(a) * a.seq_q * a.head_dim;
            const std::int64_t kv = bh_of(a) * a.seq_kv * a.head_dim;
            // forward: q, k, v, o, probs; backward also dO, dQ, dK, dV, dP.
            return a.backward ? 4 * qo + 4 * kv + a.seq_q * a.head_dim + 2 * a.seq_q * a.seq_kv
                              : 2 * qo + 2 * kv + a.seq_q * a.seq_kv;
          },
          [](const Elementwise& e) { return 3 * e.elements; },
          [](const OptimizerStep& o) { return 4 * o.params; },
          [](const Copy& c) { return 2 * ((c.bytes.count() + 3) / 4); },
          [](const Measured&) { return std::int64_t{0}; },
          [](const RooflineWork& r) { return std::max<std::int64_t>(1, r.bytes.count() / 4); },
      },
      kernel.work);
}

std::span<float> Scratch::get(std::int64_t floats) {
  const auto need = static_cast<std::size_t>(std::max<std::int64_t>(floats, 1));
  if (data_.size() < need) {
    const std::size_t old = data_.size();
    data_.resize(need);
    // splitmix64 values in [0.5, 1.5): random-looking, never zero, the same for a seed.
    std::uint64_t x = seed_ + old * 0x9E3779B97F4A7C15ull;
    for (std::size_t i = old; i < need; ++i) {
      x += 0x9E3779B97F4A7C15ull;
      std::uint64_t z = x;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      data_[i] = 0.5f + static_cast<float>(z >> 40) / static_cast<float>(1u << 24);
    }
  }
  return {data_.data(), need};
}

void gemm(std::int64_t m, std::int64_t n, std::int64_t k, std::int64_t batch, const float* a,
          const float* b, float* c) {
  for (std::int64_t p = 0; p < batch; ++p) {
    const float* ap = a + p * m * k;
    const float* bp = b + p * k * n;
    float* cp = c + p * m * n;
    for (std::int64_t i = 0; i < m; ++i) {
      float* row = cp + i * n;
      std::fill(row, row + n, 0.0f);
      for (std::int64_t l = 0; l < k; ++l) {
        const float x = ap[i * k + l];
        const float* brow = bp + l * n;
        for (std::int64_t j = 0; j < n; ++j) row[j] += x * brow[j];
      }
    }
  }
}

void attention_forward(std::int64_t bh, std::int64_t seq_q, std::int64_t seq_kv, std::int64_t d,
                       bool causal, const float* q, const float* k, const float* v, float* o,
                       float* probs) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const std::int64_t offset = seq_kv - seq_q;
  for (std::int64_t h = 0; h < bh; ++h) {
    const float* qh = q + h * seq_q * d;
    const float* kh = k + h * seq_kv * d;
    const float* vh = v + h * seq_kv * d;
    float* oh = o + h * seq_q * d;
    for (std::int64_t i = 0; i < seq_q; ++i) {
      const std::int64_t visible =
          causal ? std::clamp<std::int64_t>(i + offset + 1, 1, seq_kv) : seq_kv;
      float* p = probs + i * seq_kv;
      float top = -INFINITY;
      for (std::int64_t j = 0; j < visible; ++j) {
        float s = 0;
        for (std::int64_t x = 0; x < d; ++x) s += qh[i * d + x] * kh[j * d + x];
        p[j] = s * scale;
        top = std::max(top, p[j]);
      }
      float sum = 0;
      for (std::int64_t j = 0; j < visible; ++j) {
        p[j] = std::exp(p[j] - top);
        sum += p[j];
      }
      float* out = oh + i * d;
      std::fill(out, out + d, 0.0f);
      for (std::int64_t j = 0; j < visible; ++j) {
        const float w = p[j] / sum;
        p[j] = w;
        for (std::int64_t x = 0; x < d; ++x) out[x] += w * vh[j * d + x];
      }
      std::fill(p + visible, p + seq_kv, 0.0f);
    }
  }
}

namespace {

// Backward of attention given the forward's probabilities P (recomputed here, as flash
// attention does): dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dP * P)), dQ = dS K scale,
// dK = dS^T Q scale.
void attention_backward(std::int64_t bh, std::int64_t seq_q, std::int64_t seq_kv, std::int64_t d,
                        bool causal, const float* q, const float* k, const float* v,
                        const float* dout, float* dq, float* dk, float* dv, float* probs,
                        float* dprobs, float* o) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (std::int64_t h = 0; h < bh; ++h) {
    const float* qh = q + h * seq_q * d;
    const float* kh = k + h * seq_kv * d;
    const float* vh = v + h * seq_kv * d;
    const float* doh = dout + h * seq_q * d;
    float* dqh = dq + h * seq_q * d;
    float* dkh = dk + h * seq_kv * d;
    float* dvh = dv + h * seq_kv * d;
    attention_forward(1, seq_q, seq_kv, d, causal, qh, kh, vh, o, probs);
    std::fill(dkh, dkh + seq_kv * d, 0.0f);
    std::fill(dvh, dvh + seq_kv * d, 0.0f);
    for (std::int64_t i = 0; i < seq_q; ++i) {
      const float* p = probs + i * seq_kv;
      float* dp = dprobs + i * seq_kv;
      float dot = 0;
      for (std::int64_t j = 0; j < seq_kv; ++j) {
        float s = 0;
        for (std::int64_t x = 0; x < d; ++x) s += doh[i * d + x] * vh[j * d + x];
        dp[j] = s;
        dot += s * p[j];
        for (std::int64_t x = 0; x < d; ++x) dvh[j * d + x] += p[j] * doh[i * d + x];
      }
      float* dqi = dqh + i * d;
      std::fill(dqi, dqi + d, 0.0f);
      for (std::int64_t j = 0; j < seq_kv; ++j) {
        const float ds = p[j] * (dp[j] - dot) * scale;
        for (std::int64_t x = 0; x < d; ++x) {
          dqi[x] += ds * kh[j * d + x];
          dkh[j * d + x] += ds * qh[i * d + x];
        }
      }
    }
  }
}

}  // namespace

void adam(std::int64_t n, float* w, const float* g, float* m, float* v) {
  constexpr float lr = 1e-4f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
  constexpr float c1 = 1 - b1, c2 = 1 - b2;  // bias corrections at step 1
  for (std::int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
  }
}

void run_kernel(const Kernel& kernel, Scratch& scratch) {
  const std::span<float> s = scratch.get(scratch_floats(kernel));
  float* base = s.data();
  std::visit(Overloaded{
                 [&](const Gemm& g) {
                   gemm(g.m, g.n, g.k, g.batch, base, base + g.m * g.k * g.batch,
                        base + (g.m * g.k + g.k * g.n) * g.batch);
                 },
                 [&](const Attention& a) {
                   const std::int64_t bh = bh_of(a);
                   const std::int64_t qo = bh * a.seq_q * a.head_dim;
                   const std::int64_t kv = bh * a.seq_kv * a.head_dim;
                   float* q = base;
                   float* k = q + qo;
                   float* v = k + kv;
                   float* o = v + kv;
                   float* probs = o + qo;
                   if (!a.backward) {
                     attention_forward(bh, a.seq_q, a.seq_kv, a.head_dim, a.causal, q, k, v, o,
                                       probs);
                     return;
                   }
                   // Backward layout: q, k, v, dO, dQ, dK, dV, the recomputed output of one head,
                   // probabilities and their gradient.
                   float* dout = o;
                   float* dq = dout + qo;
                   float* dk = dq + qo;
                   float* dv = dk + kv;
                   float* head_out = dv + kv;
                   float* p = head_out + a.seq_q * a.head_dim;
                   float* dp = p + a.seq_q * a.seq_kv;
                   attention_backward(bh, a.seq_q, a.seq_kv, a.head_dim, a.causal, q, k, v, dout,
                                      dq, dk, dv, p, dp, head_out);
                 },
                 [&](const Elementwise& e) {
                   // y = x * a + z: a residual-add / scale pass reading two inputs, writing one.
                   const float* x = base;
                   const float* z = base + e.elements;
                   float* y = base + 2 * e.elements;
                   for (std::int64_t i = 0; i < e.elements; ++i) y[i] = x[i] * 1.0001f + z[i];
                 },
                 [&](const OptimizerStep& o) {
                   float* w = base;
                   float* g = w + o.params;
                   float* m = g + o.params;
                   float* v = m + o.params;
                   if (o.kind == OptimizerKind::adam) {
                     adam(o.params, w, g, m, v);
                   } else {
                     for (std::int64_t i = 0; i < o.params; ++i) w[i] -= 1e-4f * g[i];
                   }
                 },
                 [&](const Copy& c) {
                   const auto bytes = static_cast<std::size_t>(c.bytes.count());
                   const auto half = (bytes + 3) / 4;
                   std::memcpy(base + half, base, bytes);
                 },
                 [&](const Measured& m) {
                   // Busy for the measured duration (a sleep would let the thread go idle).
                   const auto until = std::chrono::steady_clock::now() +
                                      std::chrono::nanoseconds(m.duration.picoseconds() / 1000);
                   while (std::chrono::steady_clock::now() < until) {
                   }
                 },
                 [&](const RooflineWork& r) {
                   // flops / 2 multiply-adds spread over the bytes / 4 floats it touches.
                   const auto floats = std::max<std::int64_t>(1, r.bytes.count() / 4);
                   const auto madds = static_cast<std::int64_t>(r.flops.count() / 2);
                   float acc = 0;
                   for (std::int64_t i = 0; i < madds; ++i) acc += base[i % floats] * 1.0001f;
                   base[0] = acc == 0 ? 1.0f : base[0];
                 },
             },
             kernel.work);
}

}  // namespace stratasim::exec::host
