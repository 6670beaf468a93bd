// The CUDA device (see cuda_device.hpp and exec/rank_device.hpp for the contract).
//
// Streams and timing. One non-blocking CUDA stream per Program stream the rank uses. Every op
// is bracketed by CUDA events (created once with default flags, so they time, and reused from a
// pool every iteration): a start event, one event after each kernel of a compute op, the end
// event last. An op first waits (cudaStreamWaitEvent) on the end event of each dependency that
// is on another stream; ops of one stream are ordered by the stream. begin_iteration records an
// iteration-start event on the first stream and makes every other stream wait on it, so that
// cudaEventElapsedTime(start, e) is each event's time in the iteration. A collective's or
// transfer's start is its launch on its stream: the GPU cannot see when its peers arrive.
//
// Data. Kernels run on real data with the op's exact shapes, in scratch arenas outside the
// measured pools: one per stream (ops of a stream run one after another, so they share it
// without races), sized to the stream's largest op on the first begin_iteration and filled
// once with random never-zero data (kernels.hpp). An arena is an input region, only ever
// read (optimizer states aside), then a work region for outputs and communication buffers, so
// inputs stay valid random values whatever earlier ops wrote. Streaming work larger than 256 MiB
// per buffer (elementwise passes, optimizer steps, copies, collectives and transfers) wraps
// around a 256 MiB buffer or is issued in 256 MiB calls: the bytes moved are exact, the
// footprint is not (the Program's memory effects account for the real footprint in the pools).
// GEMMs and attention use buffers of their exact size (attention's score matrices are computed
// in chunks of at most 512 MiB over batch x kv-heads).
//
// Memory effects. A MemoryPool per tier: device memory from a dedicated cudaMemPool_t (release
// threshold UINT64_MAX, so freed memory stays reserved, as in a framework's caching allocator)
// with cudaMallocFromPoolAsync / cudaFreeAsync on the op's stream; host memory pinned with
// cudaHostAlloc through a cache (cudaFreeHost synchronises the device, so blocks are kept and
// reused); NVMe is accounted only. Effects at the start apply before the op's work is enqueued,
// effects at the end after it. The pools see host-side issue order; the times of the samples and
// peaks are the measured start (or end) of the op whose effect it was, filled in afterwards.
//
// NCCL. One communicator per Program group with collectives and one per direction of every
// pair of ranks that transfers, all split from the world communicator (ncclCommSplit, every rank
// in the same order: groups by index, then pairs). A direction of a pair gets its own
// communicator because the Program matches the k-th send a->b with the k-th receive at b from a
// independently of b->a: with one communicator per pair, a's send to b (pp-send stream) and a's
// receive from b (pp-recv stream) would share the communicator's order, and two ranks issuing
// them in opposite orders (1F1B's steady state) could wait on each other forever. One direction
// keeps a single FIFO with the same order at both ends. Communicators are nonblocking
// (ncclConfig_t::blocking = 0), so that creating them and any call that must wait for peers
// (ncclInProgress) is polled with the world's abort flag and a time limit, never stuck.
#include "exec/cuda/cuda_device.hpp"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "exec/cuda/check.hpp"
#include "exec/cuda/gemm.hpp"
#include "exec/cuda/kernels.hpp"
#include "exec/memory_pool.hpp"

namespace stratasim::exec::cuda {

using namespace strategies;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::int64_t kAlign = 256;
constexpr std::int64_t kBufferCap = std::int64_t{1} << 28;  // bytes per streaming buffer
constexpr std::int64_t kUnitCap = kBufferCap / 16;          // 16-byte units (a power of two)
constexpr std::int64_t kParamCap = std::int64_t{1} << 24;   // parameters per optimizer buffer
constexpr std::int64_t kScoresCap = std::int64_t{1} << 29;  // attention scores per chunk
constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;
constexpr auto kSetupTimeout = std::chrono::minutes(10);
constexpr auto kTeardownTimeout = std::chrono::seconds(60);

std::int64_t align_up(std::int64_t v) {
  return (v + kAlign - 1) / kAlign * kAlign;
}
std::int64_t units_of(std::int64_t bytes) {
  return (std::max<std::int64_t>(bytes, 0) + 15) / 16;
}
std::int64_t buffer_units(std::int64_t bytes) {
  return std::min(units_of(bytes), kUnitCap);
}

// A region of an arena: buffers are taken one after another, aligned. Without a base it only
// measures (the same code sizes the arenas and runs the ops).
struct Carve {
  char* base = nullptr;
  std::int64_t used = 0;
  char* take(std::int64_t bytes) {
    char* p = base ? base + used : nullptr;
    used += align_up(std::max<std::int64_t>(bytes, 1));
    return p;
  }
};

kernels::ElemType elem_type(DType t) {
  switch (t) {
    case DType::fp32:
    case DType::tf32:
      return kernels::ElemType::f32;
    case DType::fp16:
      return kernels::ElemType::f16;
    case DType::bf16:
      return kernels::ElemType::bf16;
    case DType::fp8:
    case DType::fp4:  // packed 4-bit elements move as bytes
      return kernels::ElemType::fp8;
  }
  return kernels::ElemType::f32;
}

kernels::ElementwiseMode mode_of(const std::string& name) {
  std::string n = name;
  for (char& c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto has = [&](const char* s) { return n.find(s) != std::string::npos; };
  if (has("norm")) return kernels::ElementwiseMode::norm;
  if (has("gelu") || has("act") || has("swiglu") || has("silu") || has("relu")) {
    return kernels::ElementwiseMode::activation;
  }
  if (has("dropout")) return kernels::ElementwiseMode::dropout;
  if (has("residual") || has("add")) return kernels::ElementwiseMode::residual;
  return kernels::ElementwiseMode::generic;
}

ncclDataType_t nccl_type(DType t, const CallContext& ctx) {
  switch (t) {
    case DType::fp32:
    case DType::tf32:
      return ncclFloat32;
    case DType::fp16:
      return ncclFloat16;
    case DType::bf16:
      return ncclBfloat16;
    case DType::fp4:
      return ncclUint8;  // packed 4-bit payload: two elements a byte
    case DType::fp8:
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
      return ncclFloat8e4m3;
#else
      throw ExecError(ctx.where() + ": this NCCL has no fp8 type (NCCL 2.24 or newer needed)");
#endif
  }
  (void)ctx;
  return ncclFloat32;
}

MatmulShape shape(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k,
                  std::int64_t batch, std::int64_t lda, std::int64_t ldb, std::int64_t ldc,
                  std::int64_t sa, std::int64_t sb, std::int64_t sc, DType dtype) {
  MatmulShape s;
  s.trans_a = ta;
  s.trans_b = tb;
  s.m = m;
  s.n = n;
  s.k = k;
  s.batch = batch;
  s.lda = lda;
  s.ldb = ldb;
  s.ldc = ldc;
  s.stride_a = sa;
  s.stride_b = sb;
  s.stride_c = sc;
  s.dtype = dtype;
  return s;
}

std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The pattern of kernels::fill on the host (pinned host arenas).
void fill_host(void* data, std::int64_t bytes, std::uint64_t seed) {
  auto* words = static_cast<std::uint32_t*>(data);
  const auto half = [](std::uint32_t r) {
    return 0x3F00u | ((r & 1u) << 15) | ((r & 2u) << 6) | 0x38u | ((r >> 2) & 7u);
  };
  for (std::int64_t i = 0; i < bytes / 4; ++i) {
    const std::uint64_t h = mix(seed ^ (static_cast<std::uint64_t>(i) * 0x2545F4914F6CDD1Dull));
    words[i] =
        half(static_cast<std::uint32_t>(h)) | (half(static_cast<std::uint32_t>(h >> 32)) << 16);
  }
}

// ---- The host optimizer step (ZeRO-Offload's CPU Adam): run by a host function enqueued on
// the op's stream (so the events around it time it), over pinned memory, on several threads.
// CUDA may serialise host functions of one process, which a process driving several GPUs
// with offloaded optimizers would show as longer steps.

struct HostErrors {
  std::mutex mutex;
  std::string message;
  std::atomic<bool> failed{false};
  void set(const std::string& m) {
    std::lock_guard lock(mutex);
    if (!failed) message = m;
    failed = true;
  }
  std::string get() {
    std::lock_guard lock(mutex);
    return message;
  }
};

struct HostStepTask {
  float* p = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const void* g = nullptr;
  void* w = nullptr;
  std::int64_t n = 0, buffer = 0;
  int grad_bytes = 2, weight_bytes = 2, threads = 1;
  bool adam = true;
  std::shared_ptr<HostErrors> errors;
};

float load_value(const void* base, std::int64_t j, int bytes) {
  if (bytes == 4) return static_cast<const float*>(base)[j];
  // 2 bytes: bf16 (fp16 data is read as bf16 bits: the same work, a different rounding)
  std::uint32_t u = 0;
  if (bytes == 2) {
    u = static_cast<std::uint32_t>(static_cast<const std::uint16_t*>(base)[j]) << 16;
  } else {
    u = static_cast<std::uint32_t>(static_cast<const std::uint8_t*>(base)[j]) << 24;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void store_value(void* base, std::int64_t j, int bytes, float value) {
  if (bytes == 4) {
    static_cast<float*>(base)[j] = value;
    return;
  }
  std::uint32_t u;
  std::memcpy(&u, &value, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even bf16
  if (bytes == 2) {
    static_cast<std::uint16_t*>(base)[j] = static_cast<std::uint16_t>(u >> 16);
  } else {
    static_cast<std::uint8_t*>(base)[j] = static_cast<std::uint8_t>(u >> 24);  // fp8: top byte
  }
}

void run_host_step(const HostStepTask& t) {
  if (t.n <= 0 || t.buffer <= 0) return;
  const kernels::AdamParams a;
  const std::int64_t passes = t.n / t.buffer, rest = t.n % t.buffer;
  // Threads own disjoint ranges of the buffer and repeat each entry as often as the parameter
  // count wraps over it, so the update count is exact and no entry is shared.
  auto work = [&](std::int64_t lo, std::int64_t hi) {
    for (std::int64_t j = lo; j < hi; ++j) {
      const std::int64_t times = passes + (j < rest ? 1 : 0);
      for (std::int64_t r = 0; r < times; ++r) {
        const float g = load_value(t.g, j, t.grad_bytes);
        if (t.adam) {
          const float m = a.beta1 * t.m[j] + (1.0f - a.beta1) * g;
          // |v|: the random initial data is a valid (non-negative) variance
          const float v = a.beta2 * std::fabs(t.v[j]) + (1.0f - a.beta2) * g * g;
          t.m[j] = m;
          t.v[j] = v;
          const float p = t.p[j] - a.lr * ((m / a.bias1) / (std::sqrt(v / a.bias2) + a.eps) +
                                           a.weight_decay * t.p[j]);
          t.p[j] = p;
          store_value(t.w, j, t.weight_bytes, p);
        } else {
          store_value(t.w, j, t.weight_bytes, load_value(t.w, j, t.weight_bytes) - a.lr * g);
        }
      }
    }
  };
  const std::int64_t threads =
      std::clamp<std::int64_t>(t.threads, 1, std::max<std::int64_t>(1, t.buffer / 65536));
  std::vector<std::thread> pool;
  for (std::int64_t i = 1; i < threads; ++i) {
    pool.emplace_back(work, t.buffer * i / threads, t.buffer * (i + 1) / threads);
  }
  work(0, t.buffer / threads);
  for (auto& th : pool) th.join();
}

void host_step_callback(void* data) {
  std::unique_ptr<HostStepTask> task(static_cast<HostStepTask*>(data));
  try {
    run_host_step(*task);
  } catch (const std::exception& e) {
    task->errors->set(e.what());
  } catch (...) {
    task->errors->set("unknown error");
  }
}

// Pinned host memory for the host tier's pool, kept and reused (see the top comment).
class PinnedCache {
 public:
  PinnedCache() = default;
  PinnedCache(const PinnedCache&) = delete;
  PinnedCache& operator=(const PinnedCache&) = delete;
  ~PinnedCache() {
    trim();
    for (const auto& entry : sizes_) cudaFreeHost(entry.first);
  }
  void* allocate(std::size_t bytes) {
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= 2 * bytes + (std::size_t{1} << 20)) {
      void* p = it->second;
      sizes_[p] = it->first;
      free_.erase(it);
      return p;
    }
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
      (void)cudaGetLastError();
      trim();
      if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return nullptr;
      }
    }
    sizes_[p] = bytes;
    return p;
  }
  void release(void* p) {
    const auto it = sizes_.find(p);
    if (it == sizes_.end()) return;
    free_.emplace(it->second, p);
    sizes_.erase(it);
  }
  void trim() {
    for (const auto& entry : free_) cudaFreeHost(entry.second);
    free_.clear();
  }

 private:
  std::multimap<std::size_t, void*> free_;
  std::unordered_map<void*, std::size_t> sizes_;
};

// ---- The device.

class CudaRankDevice final : public RankDevice {
 public:
  explicit CudaRankDevice(const DeviceSetup& setup);
  ~CudaRankDevice() override { release(false); }
  CudaRankDevice(const CudaRankDevice&) = delete;
  CudaRankDevice& operator=(const CudaRankDevice&) = delete;

  void begin_iteration() override;
  void issue(OpId id) override;
  bool synchronize(std::chrono::milliseconds watchdog) override;
  std::vector<PendingOp> pending() const override { return pending_; }
  RankMeasurement measurement() const override;

 private:
  enum class When : std::uint8_t { initial, start, end };
  struct OpState {
    std::uint32_t first_event = 0;
    std::uint32_t events = 0;
    bool issued = false, enqueued = false, done = false;
  };
  struct Arena {
    char* device = nullptr;  // [input region | work region]
    std::int64_t in_bytes = 0, work_bytes = 0;
    char* host = nullptr;
    std::int64_t host_bytes = 0;
    OpId largest = 0;  // the op that needs the most (for messages)
    std::int64_t largest_bytes = -1;
  };
  struct Needs {
    std::int64_t in = 0, work = 0, host = 0;
  };
  struct EffectRecord {
    MemoryTier tier;
    When when;
    OpId op;
    Bytes total;
  };
  struct Comm {
    ncclComm_t comm;
    std::string name;
  };

  bool aborted() const { return setup_.aborted && setup_.aborted(); }
  std::uint32_t local(OpId id) const { return id - first_; }
  cudaStream_t stream_of(const Op& op) const {
    return streams_[static_cast<std::size_t>(op.stream)];
  }
  cudaEvent_t event(std::uint32_t index) const { return events_[index]; }
  cudaEvent_t end_event(std::uint32_t i) const {
    return events_[state_[i].first_event + state_[i].events - 1];
  }
  std::uint32_t acquire_events(std::uint32_t n);

  // Setup.
  void create_communicators();
  void wait_ready(ncclComm_t comm, const std::string& what);
  void wait_stream(cudaStream_t stream, const std::string& what);
  void enqueue_result(ncclComm_t comm, ncclResult_t result, const char* call);
  void plan_arenas();
  void allocate_arenas();
  std::string held_text() const;

  // Issuing.
  bool deps_enqueued(const Op& op) const;
  void enqueue(OpId id);
  void apply_effects(OpId id, bool at_end);
  void apply(MemoryTier tier, Bytes delta, MemoryCategory category, OpId id, When when,
             const std::string& what);
  Needs run_kernel(const Kernel& k, const Arena* arena, cudaStream_t st);
  Needs run_collective(const Collective& c, const Arena* arena, cudaStream_t st);
  Needs run_transfer(int peer, Bytes bytes, bool send, const Arena* arena, cudaStream_t st);
  void gemm(const Gemm& g, Carve& in, Carve& work, cudaStream_t st, bool run);
  void attention(const Attention& a, Carve& in, Carve& work, cudaStream_t st, bool run);
  void elementwise(const Kernel& k, const Elementwise& e, Carve& in, Carve& work, cudaStream_t st,
                   bool run);
  void optimizer(const OptimizerStep& o, Carve& in, Carve& work, Carve& host, cudaStream_t st,
                 bool run);
  void copy(const Copy& c, Carve& in, Carve& work, Carve& host, cudaStream_t st, bool run);
  void roofline(const RooflineWork& r, Carve& in, Carve& work, cudaStream_t st, bool run);

  // Waiting.
  bool poll();
  std::vector<PendingOp> snapshot() const;
  std::string waiting_for(OpId id) const;
  void abort_communicators() noexcept;
  Time elapsed(cudaEvent_t e) const;
  void release(bool abort) noexcept;

  DeviceSetup setup_;
  const ExecPlan& plan_;
  const Program& program_;
  const int rank_;
  const OpId first_;
  const std::uint32_t count_;
  CallContext ctx_;

  // The GPU.
  std::string device_name_;
  int sms_ = 1;
  int compute_capability_ = 0;
  std::size_t total_memory_ = 0;

  std::array<cudaStream_t, kStreamCount> streams_{};
  std::vector<int> used_streams_;
  cudaStream_t first_stream_ = nullptr;
  cudaEvent_t start_event_ = nullptr;
  std::vector<cudaEvent_t> events_;
  std::uint32_t next_event_ = 0;

  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  std::unique_ptr<Matmuls> matmuls_;

  ncclComm_t world_comm_ = nullptr;
  std::vector<ncclComm_t> group_comms_;            // per group; null where not a member
  std::map<std::pair<int, int>, ncclComm_t> p2p_;  // (from, to) -> communicator
  std::vector<Comm> comms_;                        // every communicator, in creation order
  bool comms_aborted_ = false;

  cudaMemPool_t mem_pool_ = nullptr;
  std::unique_ptr<PinnedCache> pinned_;
  cudaStream_t current_stream_ = nullptr;  // where pool allocations are ordered
  std::array<std::unique_ptr<MemoryPool>, kMemoryTierCount> pools_;
  std::vector<EffectRecord> effects_;
  std::array<std::int64_t, kMemoryTierCount> peak_effect_{};

  std::array<Arena, kStreamCount> arenas_{};
  bool arenas_ready_ = false;
  std::uint32_t seed32_ = 1;

  std::vector<OpState> state_;
  std::array<std::vector<std::uint32_t>, kStreamCount> queues_;
  std::array<std::size_t, kStreamCount> heads_{};
  std::array<std::deque<OpId>, kStreamCount> deferred_;
  std::uint32_t unfinished_ = 0;
  std::vector<PendingOp> pending_;
  std::shared_ptr<HostErrors> host_errors_ = std::make_shared<HostErrors>();
};

CudaRankDevice::CudaRankDevice(const DeviceSetup& setup)
    : setup_(setup),
      plan_(*setup.plan),
      program_(setup.plan->program()),
      rank_(setup.rank),
      first_(program_.first_op(setup.rank)),
      count_(static_cast<std::uint32_t>(program_.ops_of(setup.rank).size())) {
  ctx_.rank = rank_;
  ctx_.program = &program_;
  ctx_.held = [this] { return held_text(); };
  seed32_ =
      static_cast<std::uint32_t>(mix(setup.options.seed * 1000003u + static_cast<unsigned>(rank_)));
  try {
    STRATASIM_CUDA_CHECK(ctx_, cudaSetDevice(setup.gpu));
    cudaDeviceProp props{};
    STRATASIM_CUDA_CHECK(ctx_, cudaGetDeviceProperties(&props, setup.gpu));
    device_name_ = props.name;
    sms_ = std::max(props.multiProcessorCount, 1);
    compute_capability_ = props.major * 10 + props.minor;
    std::size_t free_memory = 0;
    STRATASIM_CUDA_CHECK(ctx_, cudaMemGetInfo(&free_memory, &total_memory_));

    // Streams: those the rank uses (at least the compute stream, for allocations and set-up).
    const std::uint32_t used = plan_.streams_of(rank_) | 1u;
    for (int s = 0; s < kStreamCount; ++s) {
      if (!(used & (1u << s))) continue;
      STRATASIM_CUDA_CHECK(ctx_, cudaStreamCreateWithFlags(&streams_[static_cast<std::size_t>(s)],
                                                           cudaStreamNonBlocking));
      used_streams_.push_back(s);
    }
    first_stream_ = streams_[static_cast<std::size_t>(used_streams_.front())];
    current_stream_ = first_stream_;
    STRATASIM_CUDA_CHECK(ctx_, cudaEventCreate(&start_event_));

    STRATASIM_CUDA_CHECK(ctx_, cublasLtCreate(&lt_));
    STRATASIM_CUDA_CHECK(ctx_, cudaMalloc(&workspace_, kWorkspaceBytes));
    matmuls_ = std::make_unique<Matmuls>(lt_, workspace_, kWorkspaceBytes, compute_capability_);

    // The device tier's pool.
    cudaMemPoolProps pool_props{};
    pool_props.allocType = cudaMemAllocationTypePinned;
    pool_props.location.type = cudaMemLocationTypeDevice;
    pool_props.location.id = setup.gpu;
    STRATASIM_CUDA_CHECK(ctx_, cudaMemPoolCreate(&mem_pool_, &pool_props));
    std::uint64_t threshold = UINT64_MAX;
    STRATASIM_CUDA_CHECK(
        ctx_, cudaMemPoolSetAttribute(mem_pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
    pinned_ = std::make_unique<PinnedCache>();
    const std::string who = "rank " + std::to_string(rank_);
    const Bytes capacity = setup.capacity.count() > 0
                               ? setup.capacity
                               : Bytes(static_cast<std::int64_t>(total_memory_));
    pools_[0] = std::make_unique<MemoryPool>(
        who + " device memory (" + device_name_ + ")", capacity,
        [this](std::size_t bytes) -> void* {
          void* p = nullptr;
          const cudaError_t status = cudaMallocFromPoolAsync(&p, bytes, mem_pool_, current_stream_);
          if (status == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();
            return nullptr;  // the pool raises OutOfMemoryError naming the op
          }
          STRATASIM_CUDA_CHECK(ctx_, status);
          return p;
        },
        [this](void* p, std::size_t) { (void)cudaFreeAsync(p, current_stream_); });
    pools_[1] = std::make_unique<MemoryPool>(
        who + " host memory (pinned)", Bytes(0),
        [this](std::size_t bytes) { return pinned_->allocate(bytes); },
        [this](void* p, std::size_t) { pinned_->release(p); });
    pools_[2] = std::make_unique<MemoryPool>(who + " NVMe (accounted only)", Bytes(0));

    state_.assign(count_, OpState{});
    plan_arenas();
    create_communicators();
  } catch (...) {
    release(true);
    throw;
  }
}

// ---- NCCL communicators.

void CudaRankDevice::wait_ready(ncclComm_t comm, const std::string& what) {
  const auto start = Clock::now();
  for (;;) {
    ncclResult_t state = ncclSuccess;
    STRATASIM_CUDA_CHECK(ctx_, ncclCommGetAsyncError(comm, &state));
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      fail_call(ctx_, what.c_str(),
                std::string(ncclGetErrorString(state)) + ": " + ncclGetLastError(comm));
    }
    if (aborted()) throw ExecError(ctx_.where() + ": " + what + ": the run was aborted");
    if (Clock::now() - start > kSetupTimeout) {
      throw ExecError(ctx_.where() + ": " + what +
                      ": no progress for 10 minutes (is every rank of the world running?)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void CudaRankDevice::wait_stream(cudaStream_t stream, const std::string& what) {
  const auto start = Clock::now();
  for (;;) {
    const cudaError_t status = cudaStreamQuery(stream);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) check_call(status, what.c_str(), ctx_);
    (void)cudaGetLastError();
    if (aborted()) throw ExecError(ctx_.where() + ": " + what + ": the run was aborted");
    if (Clock::now() - start > kSetupTimeout) {
      throw ExecError(ctx_.where() + ": " + what + ": not finished after 10 minutes");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void CudaRankDevice::enqueue_result(ncclComm_t comm, ncclResult_t result, const char* call) {
  check_call(result, call, ctx_);
  if (result == ncclInProgress) wait_ready(comm, call);
}

#define STRATASIM_NCCL_ENQUEUE(comm, call) enqueue_result((comm), (call), #call)

void CudaRankDevice::create_communicators() {
  const int world = program_.world_size();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  STRATASIM_CUDA_CHECK(ctx_,
                       ncclCommInitRankConfig(&world_comm_, world, setup_.nccl_id, rank_, &config));
  comms_.push_back({world_comm_, "the world"});
  wait_ready(world_comm_, "ncclCommInitRankConfig (the world's communicator)");

  // One communicator per group with collectives, in group order on every rank.
  group_comms_.assign(program_.groups().size(), nullptr);
  for (std::uint32_t g = 0; g < program_.groups().size(); ++g) {
    if (plan_.collectives_on(g) == 0) continue;
    const int member = plan_.member_index(g, rank_);
    ncclComm_t comm = nullptr;
    STRATASIM_CUDA_CHECK(
        ctx_, ncclCommSplit(world_comm_, member >= 0 ? static_cast<int>(g) : NCCL_SPLIT_NOCOLOR,
                            std::max(member, 0), &comm, &config));
    const std::string what = "ncclCommSplit (group '" + program_.groups()[g].name + "')";
    wait_ready(world_comm_, what);
    if (comm) {
      comms_.push_back({comm, "group '" + program_.groups()[g].name + "'"});
      group_comms_[g] = comm;
      wait_ready(comm, what);
    }
  }

  // One communicator per direction of every pair that transfers (see the top comment). Pairs
  // are packed into rounds in which each rank is in at most one pair, one split per round.
  std::set<std::pair<int, int>> pairs;
  for (const Op& op : program_.ops()) {
    if (const auto* s = std::get_if<Send>(&op.work)) {
      if (s->peer != op.rank) pairs.insert({op.rank, s->peer});
    }
  }
  std::vector<std::vector<std::pair<int, int>>> rounds;
  std::vector<std::vector<char>> busy;
  for (const auto& pair : pairs) {
    std::size_t r = 0;
    while (r < rounds.size() && (busy[r][static_cast<std::size_t>(pair.first)] ||
                                 busy[r][static_cast<std::size_t>(pair.second)])) {
      ++r;
    }
    if (r == rounds.size()) {
      rounds.emplace_back();
      busy.emplace_back(static_cast<std::size_t>(world), 0);
    }
    rounds[r].push_back(pair);
    busy[r][static_cast<std::size_t>(pair.first)] = 1;
    busy[r][static_cast<std::size_t>(pair.second)] = 1;
  }
  for (const auto& round : rounds) {
    int color = NCCL_SPLIT_NOCOLOR, key = 0;
    std::pair<int, int> mine{-1, -1};
    for (std::size_t i = 0; i < round.size(); ++i) {
      if (round[i].first == rank_ || round[i].second == rank_) {
        color = static_cast<int>(i);
        key = round[i].first == rank_ ? 0 : 1;  // the sender is rank 0 of the pair
        mine = round[i];
      }
    }
    ncclComm_t comm = nullptr;
    STRATASIM_CUDA_CHECK(ctx_, ncclCommSplit(world_comm_, color, key, &comm, &config));
    const std::string what = "ncclCommSplit (transfers " + std::to_string(mine.first) + " -> " +
                             std::to_string(mine.second) + ")";
    wait_ready(world_comm_, what);
    if (comm) {
      comms_.push_back({comm, "transfers from rank " + std::to_string(mine.first) + " to rank " +
                                  std::to_string(mine.second)});
      p2p_[mine] = comm;
      wait_ready(comm, what);
    }
  }

  // NCCL connects send/recv peers on first use, which needs both ends: connect every pair now,
  // in one group, so that no transfer of the Program waits on the host for its peer.
  if (!p2p_.empty()) {
    STRATASIM_CUDA_CHECK(ctx_, ncclGroupStart());
    std::size_t index = 0;
    for (const auto& [pair, comm] : p2p_) {
      char* byte = static_cast<char*>(workspace_) + index++;
      if (pair.first == rank_) {
        STRATASIM_CUDA_CHECK(ctx_, ncclSend(byte, 1, ncclUint8, 1, comm, first_stream_));
      } else {
        STRATASIM_CUDA_CHECK(ctx_, ncclRecv(byte, 1, ncclUint8, 0, comm, first_stream_));
      }
    }
    STRATASIM_CUDA_CHECK(ctx_, ncclGroupEnd());
    for (const auto& entry : p2p_) wait_ready(entry.second, "connecting send/recv peers");
    wait_stream(first_stream_, "connecting send/recv peers");
  }

  // The world's communicator was only the parent of the others: free its buffers (every rank
  // does it here, after the same splits).
  STRATASIM_CUDA_CHECK(ctx_, ncclCommFinalize(world_comm_));
  wait_ready(world_comm_, "ncclCommFinalize (the world's communicator)");
  STRATASIM_CUDA_CHECK(ctx_, ncclCommDestroy(world_comm_));
  comms_.erase(comms_.begin());
  world_comm_ = nullptr;
}

// ---- Scratch arenas.

void CudaRankDevice::plan_arenas() {
  for (std::uint32_t i = 0; i < count_; ++i) {
    const OpId id = first_ + i;
    const Op& op = program_.op(id);
    Needs needs;
    if (const auto* c = std::get_if<Compute>(&op.work)) {
      for (const Kernel& k : program_.kernels_of(*c)) {
        const Needs n = run_kernel(k, nullptr, nullptr);
        needs.in = std::max(needs.in, n.in);
        needs.work = std::max(needs.work, n.work);
        needs.host = std::max(needs.host, n.host);
      }
    } else if (const auto* col = std::get_if<Collective>(&op.work)) {
      needs = run_collective(*col, nullptr, nullptr);
    } else if (const auto* s = std::get_if<Send>(&op.work)) {
      needs = run_transfer(s->peer, s->bytes, true, nullptr, nullptr);
    } else if (const auto* r = std::get_if<Recv>(&op.work)) {
      needs = run_transfer(r->peer, r->bytes, false, nullptr, nullptr);
    }
    Arena& a = arenas_[static_cast<std::size_t>(op.stream)];
    a.in_bytes = std::max(a.in_bytes, needs.in);
    a.work_bytes = std::max(a.work_bytes, needs.work);
    a.host_bytes = std::max(a.host_bytes, needs.host);
    if (needs.in + needs.work > a.largest_bytes) {
      a.largest_bytes = needs.in + needs.work;
      a.largest = id;
    }
  }
}

void CudaRankDevice::allocate_arenas() {
  for (int s : used_streams_) {
    Arena& a = arenas_[static_cast<std::size_t>(s)];
    const std::int64_t device_bytes = a.in_bytes + a.work_bytes;
    if (device_bytes > 0) {
      void* p = nullptr;
      const cudaError_t status = cudaMalloc(&p, static_cast<std::size_t>(device_bytes));
      if (status != cudaSuccess) {
        (void)cudaGetLastError();
        CallContext at = ctx_;
        at.op = a.largest;
        fail_call(at, "cudaMalloc",
                  std::string(cudaGetErrorString(status)) + " (the scratch buffers of stream " +
                      std::string(name_of(static_cast<Stream>(s))) + ", " +
                      to_string(Bytes(device_bytes)) + ", sized for this op, do not fit)",
                  status == cudaErrorMemoryAllocation);
      }
      a.device = static_cast<char*>(p);
      STRATASIM_CUDA_CHECK(ctx_, kernels::fill(a.device, static_cast<std::uint64_t>(device_bytes),
                                               setup_.options.seed * 7919u +
                                                   static_cast<unsigned>(rank_ * kStreamCount + s),
                                               first_stream_));
    }
    if (a.host_bytes > 0) {
      void* p = nullptr;
      STRATASIM_CUDA_CHECK(
          ctx_, cudaHostAlloc(&p, static_cast<std::size_t>(a.host_bytes), cudaHostAllocDefault));
      a.host = static_cast<char*>(p);
      fill_host(a.host, a.host_bytes, setup_.options.seed * 104729u + static_cast<unsigned>(rank_));
    }
  }
  wait_stream(first_stream_, "filling the scratch buffers");
  arenas_ready_ = true;
}

std::string CudaRankDevice::held_text() const {
  std::string text;
  for (int t = 0; t < kMemoryTierCount; ++t) {
    const MemoryPool* pool = pools_[static_cast<std::size_t>(t)].get();
    if (!pool || pool->in_use().count() == 0) continue;
    std::string parts;
    for (int c = 0; c < kMemoryCategoryCount; ++c) {
      const Bytes b = pool->held(static_cast<MemoryCategory>(c));
      if (b.count() == 0) continue;
      if (!parts.empty()) parts += ", ";
      parts += std::string(name_of(static_cast<MemoryCategory>(c))) + " " + to_string(b);
    }
    if (!text.empty()) text += "; ";
    text += std::string(name_of(static_cast<MemoryTier>(t))) + " " + to_string(pool->in_use()) +
            " (" + parts + ")";
  }
  return text.empty() ? "nothing" : text;
}

// ---- Iterations.

std::uint32_t CudaRankDevice::acquire_events(std::uint32_t n) {
  const std::uint32_t first = next_event_;
  while (events_.size() < static_cast<std::size_t>(first) + n) {
    cudaEvent_t e = nullptr;
    STRATASIM_CUDA_CHECK(ctx_, cudaEventCreate(&e));
    events_.push_back(e);
  }
  next_event_ += n;
  return first;
}

void CudaRankDevice::begin_iteration() {
  ctx_.op.reset();
  STRATASIM_CUDA_CHECK(ctx_, cudaSetDevice(setup_.gpu));
  if (!arenas_ready_) allocate_arenas();
  std::fill(state_.begin(), state_.end(), OpState{});
  for (auto& q : queues_) q.clear();
  heads_.fill(0);
  for (auto& d : deferred_) d.clear();
  next_event_ = 0;
  unfinished_ = 0;
  pending_.clear();
  effects_.clear();
  peak_effect_.fill(-1);

  current_stream_ = first_stream_;
  for (auto& pool : pools_) pool->reset();
  std::uint64_t zero = 0;
  STRATASIM_CUDA_CHECK(ctx_,
                       cudaMemPoolSetAttribute(mem_pool_, cudaMemPoolAttrReservedMemHigh, &zero));
  for (const ResidentMemory& m : program_.initial_memory(rank_)) {
    apply(m.tier, m.bytes, m.category, first_, When::initial, "the rank's initial memory");
  }
  STRATASIM_CUDA_CHECK(ctx_, cudaEventRecord(start_event_, first_stream_));
  for (int s : used_streams_) {
    cudaStream_t st = streams_[static_cast<std::size_t>(s)];
    if (st != first_stream_) STRATASIM_CUDA_CHECK(ctx_, cudaStreamWaitEvent(st, start_event_, 0));
  }
}

void CudaRankDevice::apply(MemoryTier tier, Bytes delta, MemoryCategory category, OpId id,
                           When when, const std::string& what) {
  if (delta.count() == 0) return;
  MemoryPool& pool = *pools_[static_cast<std::size_t>(tier)];
  const Bytes before = pool.peak().peak;
  pool.apply(delta, category, id, Time(), what);
  effects_.push_back({tier, when, id, pool.in_use()});
  if (pool.peak().peak > before) {
    peak_effect_[static_cast<std::size_t>(tier)] = static_cast<std::int64_t>(effects_.size()) - 1;
  }
}

void CudaRankDevice::apply_effects(OpId id, bool at_end) {
  const Op& op = program_.op(id);
  std::string what;
  for (const MemoryEffect& e : program_.effects_of(op)) {
    if (e.at_end != at_end || e.delta.count() == 0) continue;
    if (what.empty()) what = program_.describe(id);
    apply(e.tier, e.delta, e.category, id, at_end ? When::end : When::start, what);
  }
}

bool CudaRankDevice::deps_enqueued(const Op& op) const {
  for (OpId d : program_.deps_of(op)) {
    if (!state_[local(d)].enqueued) return false;
  }
  return true;
}

void CudaRankDevice::issue(OpId id) {
  const Op& op = program_.op(id);
  const auto s = static_cast<std::size_t>(op.stream);
  state_[local(id)].issued = true;
  ++unfinished_;
  // An op whose dependency comes later in issue order (the Program allows it) waits on the host
  // until that op is enqueued, with the ops after it on its stream: a CUDA event cannot be
  // waited on before it is recorded.
  if (!deferred_[s].empty() || !deps_enqueued(op)) {
    deferred_[s].push_back(id);
    return;
  }
  enqueue(id);
  for (bool progress = true; progress;) {
    progress = false;
    for (auto& d : deferred_) {
      while (!d.empty() && deps_enqueued(program_.op(d.front()))) {
        const OpId next = d.front();
        d.pop_front();
        enqueue(next);
        progress = true;
      }
    }
  }
}

void CudaRankDevice::enqueue(OpId id) {
  const Op& op = program_.op(id);
  const std::uint32_t i = local(id);
  ctx_.op = id;
  cudaStream_t st = stream_of(op);
  for (OpId d : program_.deps_of(op)) {
    if (program_.op(d).stream != op.stream) {
      STRATASIM_CUDA_CHECK(ctx_, cudaStreamWaitEvent(st, end_event(local(d)), 0));
    }
  }
  current_stream_ = st;
  apply_effects(id, false);

  const Arena* arena = &arenas_[static_cast<std::size_t>(op.stream)];
  OpState& state = state_[i];
  if (const auto* c = std::get_if<Compute>(&op.work)) {
    const auto& kernels = program_.kernels_of(*c);
    const auto n = static_cast<std::uint32_t>(kernels.size());
    state.first_event = acquire_events(n + 1);
    state.events = n + 1;
    STRATASIM_CUDA_CHECK(ctx_, cudaEventRecord(event(state.first_event), st));
    for (std::uint32_t k = 0; k < n; ++k) {
      run_kernel(kernels[k], arena, st);
      STRATASIM_CUDA_CHECK(ctx_, cudaEventRecord(event(state.first_event + k + 1), st));
    }
  } else {
    state.first_event = acquire_events(2);
    state.events = 2;
    STRATASIM_CUDA_CHECK(ctx_, cudaEventRecord(event(state.first_event), st));
    if (const auto* col = std::get_if<Collective>(&op.work)) {
      run_collective(*col, arena, st);
    } else if (const auto* s = std::get_if<Send>(&op.work)) {
      run_transfer(s->peer, s->bytes, true, arena, st);
    } else if (const auto* r = std::get_if<Recv>(&op.work)) {
      run_transfer(r->peer, r->bytes, false, arena, st);
    }
    STRATASIM_CUDA_CHECK(ctx_, cudaEventRecord(event(state.first_event + 1), st));
  }
  current_stream_ = st;
  apply_effects(id, true);
  state.enqueued = true;
  queues_[static_cast<std::size_t>(op.stream)].push_back(i);
  ctx_.op.reset();
}

// ---- Kernels.

CudaRankDevice::Needs CudaRankDevice::run_kernel(const Kernel& k, const Arena* arena,
                                                 cudaStream_t st) {
  Carve in{arena ? arena->device : nullptr};
  Carve work{arena ? arena->device + arena->in_bytes : nullptr};
  Carve host{arena ? arena->host : nullptr};
  const bool run = arena != nullptr;
  std::visit(
      [&](const auto& w) {
        using W = std::decay_t<decltype(w)>;
        if constexpr (std::is_same_v<W, Gemm>) {
          gemm(w, in, work, st, run);
        } else if constexpr (std::is_same_v<W, Attention>) {
          attention(w, in, work, st, run);
        } else if constexpr (std::is_same_v<W, Elementwise>) {
          elementwise(k, w, in, work, st, run);
        } else if constexpr (std::is_same_v<W, OptimizerStep>) {
          optimizer(w, in, work, host, st, run);
        } else if constexpr (std::is_same_v<W, Copy>) {
          copy(w, in, work, host, st, run);
        } else if constexpr (std::is_same_v<W, Measured>) {
          if (run) {
            const std::int64_t ns = std::max<std::int64_t>(0, w.duration.picoseconds() / 1000);
            STRATASIM_CUDA_CHECK(ctx_, kernels::spin(static_cast<std::uint64_t>(ns), st));
          }
        } else if constexpr (std::is_same_v<W, RooflineWork>) {
          roofline(w, in, work, st, run);
        }
      },
      k.work);
  return {in.used, work.used, host.used};
}

void CudaRankDevice::gemm(const Gemm& g, Carve& in, Carve& work, cudaStream_t st, bool run) {
  const std::int64_t ei = input_bytes(g.dtype), eo = output_bytes(g.dtype);
  const char* a = in.take(g.m * g.k * g.batch * ei);
  const char* b = in.take(g.k * g.n * g.batch * ei);
  char* d = work.take(g.m * g.n * g.batch * eo);
  if (!run || g.m <= 0 || g.n <= 0 || g.k <= 0 || g.batch <= 0) return;
  matmuls_->run(MatmulShape::tn(g.m, g.n, g.k, g.batch, g.dtype), a, b, d, st, ctx_);
}

// Attention as the unfused kernels of Megatron-LM compute it, in chunks of batch x kv-heads:
// S = Q K^T (batched GEMM), a causal-masked softmax (own kernel), O = P V; the backward pass
// recomputes S and P (as FlashAttention does, so nothing is kept from the forward) and computes
// dP = dO V^T, dV = P^T dO, dS = softmax-backward(P, dP), dQ = dS K, dK = dS^T Q. With grouped
// queries, the `heads / kv_heads` query heads of a kv head are stacked into one matrix of
// group x seq_q rows, so each GEMM has every head's FLOPs and dK, dV sum over the group. fp8
// attention runs in bf16: cuBLASLt's fp8 GEMMs need the TN layout that P V and the backward
// products do not have (FlashAttention-3's fp8 kernels are not reproduced).
void CudaRankDevice::attention(const Attention& at, Carve& in, Carve& work, cudaStream_t st,
                               bool run) {
  const DType dt = at.dtype == DType::fp8 ? DType::bf16 : at.dtype;
  const std::int64_t e = size_of(dt);
  const std::int64_t heads = std::max<std::int64_t>(at.heads, 1);
  const std::int64_t kv =
      at.kv_heads > 0 && at.kv_heads <= heads && heads % at.kv_heads == 0 ? at.kv_heads : heads;
  const std::int64_t group = heads / kv, sq = at.seq_q, skv = at.seq_kv, d = at.head_dim;
  const std::int64_t mq = group * sq, items = at.batch * kv;
  if (items <= 0 || sq <= 0 || skv <= 0 || d <= 0) return;
  const std::int64_t chunk =
      std::clamp<std::int64_t>(kScoresCap / std::max<std::int64_t>(mq * skv * e, 1), 1, items);
  char* q = in.take(items * mq * d * e);
  char* k = in.take(items * skv * d * e);
  char* v = in.take(items * skv * d * e);
  char* dout = at.backward ? in.take(items * mq * d * e) : nullptr;
  char* s = work.take(chunk * mq * skv * e);
  char* dp = at.backward ? work.take(chunk * mq * skv * e) : nullptr;
  char* out = work.take(items * mq * d * e);  // O, or dQ
  char* dk = at.backward ? work.take(items * skv * d * e) : nullptr;
  char* dv = at.backward ? work.take(items * skv * d * e) : nullptr;
  if (!run) return;

  const kernels::ElemType et = elem_type(dt);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (std::int64_t c0 = 0; c0 < items; c0 += chunk) {
    const std::int64_t nb = std::min(chunk, items - c0);
    const auto qs = [&](char* base) { return base + c0 * mq * d * e; };
    const auto ks = [&](char* base) { return base + c0 * skv * d * e; };
    // S (skv x mq, column-major) = K^T Q
    matmuls_->run(shape(true, false, skv, mq, d, nb, d, d, skv, skv * d, mq * d, mq * skv, dt),
                  ks(k), qs(q), s, st, ctx_);
    STRATASIM_CUDA_CHECK(ctx_,
                         kernels::softmax_forward(et, s, nb * mq, skv, sq, at.causal, scale, st));
    if (!at.backward) {
      // O (d x mq) = V P
      matmuls_->run(shape(false, false, d, mq, skv, nb, d, skv, d, skv * d, mq * skv, mq * d, dt),
                    ks(v), s, qs(out), st, ctx_);
      continue;
    }
    // dP (skv x mq) = V^T dO
    matmuls_->run(shape(true, false, skv, mq, d, nb, d, d, skv, skv * d, mq * d, mq * skv, dt),
                  ks(v), qs(dout), dp, st, ctx_);
    // dV (d x skv) = dO P^T
    matmuls_->run(shape(false, true, d, skv, mq, nb, d, skv, d, mq * d, mq * skv, skv * d, dt),
                  qs(dout), s, ks(dv), st, ctx_);
    STRATASIM_CUDA_CHECK(ctx_, kernels::softmax_backward(et, s, dp, nb * mq, skv, scale, st));
    // dQ (d x mq) = K dS
    matmuls_->run(shape(false, false, d, mq, skv, nb, d, skv, d, skv * d, mq * skv, mq * d, dt),
                  ks(k), dp, qs(out), st, ctx_);
    // dK (d x skv) = Q dS^T
    matmuls_->run(shape(false, true, d, skv, mq, nb, d, skv, d, mq * d, mq * skv, skv * d, dt),
                  qs(q), dp, ks(dk), st, ctx_);
  }
}

void CudaRankDevice::elementwise(const Kernel& k, const Elementwise& w, Carve& in, Carve& work,
                                 cudaStream_t st, bool run) {
  const std::int64_t read = std::max<std::int64_t>(w.bytes_read.count(), 0);
  const std::int64_t written = std::max<std::int64_t>(w.bytes_written.count(), 0);
  const std::int64_t in_units = buffer_units(read), out_units = buffer_units(written);
  const char* src = read > 0 ? in.take(in_units * 16) : nullptr;
  char* dst = written > 0 ? work.take(out_units * 16) : nullptr;
  if (!run) return;
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  STRATASIM_CUDA_CHECK(
      ctx_, kernels::elementwise(mode_of(k.name), src, u(read),
                                 kernels::wrap_mask(u(units_of(read)), u(in_units)), dst,
                                 u(written), kernels::wrap_mask(u(units_of(written)), u(out_units)),
                                 seed32_, sms_, st));
}

void CudaRankDevice::optimizer(const OptimizerStep& o, Carve& in, Carve& work, Carve& host,
                               cudaStream_t st, bool run) {
  const std::int64_t n = std::max<std::int64_t>(o.params, 0);
  const std::int64_t nb = std::min(n, kParamCap);
  const auto mask =
      kernels::wrap_mask(static_cast<std::uint64_t>(n), static_cast<std::uint64_t>(nb));
  const std::int64_t ew = size_of(o.dtype);
  const std::int64_t eg = o.dtype == DType::fp8 ? 2 : ew;  // fp8 training keeps bf16 gradients
  const bool adam = o.kind == OptimizerKind::adam;
  if (o.on_host) {
    auto task = std::make_unique<HostStepTask>();
    if (adam) {
      task->p = reinterpret_cast<float*>(host.take(4 * nb));
      task->m = reinterpret_cast<float*>(host.take(4 * nb));
      task->v = reinterpret_cast<float*>(host.take(4 * nb));
    }
    task->g = host.take(eg * nb);
    task->w = host.take(ew * nb);
    if (!run || n == 0) return;
    task->n = n;
    task->buffer = nb;
    task->grad_bytes = static_cast<int>(eg);
    task->weight_bytes = static_cast<int>(ew);
    task->threads = setup_.host_threads;
    task->adam = adam;
    task->errors = host_errors_;
    STRATASIM_CUDA_CHECK(ctx_, cudaLaunchHostFunc(st, host_step_callback, task.get()));
    (void)task.release();  // the callback owns it now
    return;
  }
  if (adam) {
    auto* p = reinterpret_cast<float*>(in.take(4 * nb));
    auto* m = reinterpret_cast<float*>(in.take(4 * nb));
    auto* v = reinterpret_cast<float*>(in.take(4 * nb));
    const char* g = in.take(eg * nb);
    char* w = work.take(ew * nb);
    if (!run || n == 0) return;
    STRATASIM_CUDA_CHECK(
        ctx_, kernels::adam(elem_type(o.dtype), p, m, v, g, w, static_cast<std::uint64_t>(n), mask,
                            kernels::AdamParams{}, sms_, st));
  } else {
    const char* g = in.take(ew * nb);
    char* w = work.take(ew * nb);
    if (!run || n == 0) return;
    STRATASIM_CUDA_CHECK(ctx_, kernels::sgd(elem_type(o.dtype), w, g, static_cast<std::uint64_t>(n),
                                            mask, kernels::AdamParams{}.lr, sms_, st));
  }
}

// Copies between tiers: device memory in the arena, host memory in the pinned host arena. The
// NVMe tier is treated as pinned host memory (the device does not drive NVMe; ZeRO-Infinity's
// NVMe reads and writes are timed as host-memory copies over PCIe).
void CudaRankDevice::copy(const Copy& c, Carve& in, Carve& work, Carve& host, cudaStream_t st,
                          bool run) {
  const std::int64_t bytes = std::max<std::int64_t>(c.bytes.count(), 0);
  const std::int64_t chunk = std::min(bytes, kBufferCap);
  const bool from_device = c.from == MemoryTier::device, to_device = c.to == MemoryTier::device;
  const char* src = from_device ? in.take(chunk) : host.take(chunk);
  char* dst = to_device ? work.take(chunk) : host.take(chunk);
  if (!run || bytes == 0) return;
  const cudaMemcpyKind kind = from_device
                                  ? (to_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                                  : (to_device ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  for (std::int64_t offset = 0; offset < bytes; offset += chunk) {
    const auto size = static_cast<std::size_t>(std::min(chunk, bytes - offset));
    STRATASIM_CUDA_CHECK(ctx_, cudaMemcpyAsync(dst, src, size, kind, st));
  }
}

// Work known by its FLOPs and bytes: in a tensor-core dtype, the FLOPs as square GEMMs (side a
// multiple of 256, at most 8192) and the bytes as a streaming pass; in fp32, FMAs on the values
// streamed (CUDA cores). Roughly the roofline's max(flops / peak, bytes / bandwidth), summed.
void CudaRankDevice::roofline(const RooflineWork& r, Carve& in, Carve& work, cudaStream_t st,
                              bool run) {
  const double flops = std::max(r.flops.count(), 0.0);
  const std::int64_t bytes = std::max<std::int64_t>(r.bytes.count(), 0);
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  const bool tensor = r.dtype != DType::fp32 && flops >= 2.0 * 256 * 256 * 256;
  if (tensor) {
    const double side = std::cbrt(flops / 2.0);
    const std::int64_t s = std::clamp<std::int64_t>(std::llround(side / 256.0) * 256, 256, 8192);
    const std::int64_t reps = std::max<std::int64_t>(
        1, std::llround(flops / (2.0 * static_cast<double>(s) * static_cast<double>(s) *
                                 static_cast<double>(s))));
    const char* a = in.take(s * s * input_bytes(r.dtype));
    const char* b = in.take(s * s * input_bytes(r.dtype));
    char* d = work.take(s * s * output_bytes(r.dtype));
    const std::int64_t read = bytes / 2, written = bytes - bytes / 2;
    const char* src = read > 0 ? in.take(buffer_units(read) * 16) : nullptr;
    char* dst = written > 0 ? work.take(buffer_units(written) * 16) : nullptr;
    if (!run) return;
    for (std::int64_t i = 0; i < reps; ++i) {
      matmuls_->run(MatmulShape::tn(s, s, s, 1, r.dtype), a, b, d, st, ctx_);
    }
    STRATASIM_CUDA_CHECK(
        ctx_,
        kernels::elementwise(
            kernels::ElementwiseMode::generic, src, u(read),
            kernels::wrap_mask(u(units_of(read)), u(buffer_units(read))), dst, u(written),
            kernels::wrap_mask(u(units_of(written)), u(buffer_units(written))), seed32_, sms_, st));
    return;
  }
  std::int64_t elements = bytes / 8;  // each value read and written back as fp32
  float* buffer = nullptr;
  std::uint64_t mask = ~std::uint64_t{0};
  std::uint32_t fmas = 256;
  if (elements > 0) {
    const std::int64_t quads = (elements + 3) / 4;
    const std::int64_t held = std::min(quads, kBufferCap / 16);
    buffer = reinterpret_cast<float*>(work.take(held * 16));
    mask = kernels::wrap_mask(u(quads), u(held));
    fmas = static_cast<std::uint32_t>(
        std::clamp<double>(std::ceil(flops / 2.0 / static_cast<double>(elements)), 0.0, 1e9));
  } else {
    elements = static_cast<std::int64_t>(std::ceil(flops / 2.0 / fmas));
  }
  if (!run || elements == 0) return;
  STRATASIM_CUDA_CHECK(ctx_, kernels::roofline_fma(buffer, u(elements), mask, fmas, sms_, st));
}

// ---- Collectives and transfers.

// `bytes` is the whole buffer as nccl-tests counts it. Above 256 MiB a collective is issued as
// several calls of at most 256 MiB each (every member splits it the same way).
CudaRankDevice::Needs CudaRankDevice::run_collective(const Collective& c, const Arena* arena,
                                                     cudaStream_t st) {
  const Group& group = program_.groups()[c.group];
  const auto n = static_cast<std::int64_t>(group.ranks.size());
  const std::int64_t esize = size_of(c.dtype);
  const bool per_rank = strategies::traits_of(c.kind).sliced;
  const std::int64_t unit = esize * (per_rank ? std::max<std::int64_t>(n, 1) : 1);
  const std::int64_t total_units = std::max<std::int64_t>(c.bytes.count(), 0) / unit;
  const std::int64_t chunk_units =
      std::max<std::int64_t>(1, std::min(total_units, kBufferCap / unit));
  Carve work{arena ? arena->device + arena->in_bytes : nullptr};
  char* buffer = work.take(chunk_units * unit);
  char* second = c.kind == CollectiveKind::all_to_all ? work.take(chunk_units * unit) : nullptr;
  const Needs needs{0, work.used, 0};
  if (!arena) return needs;

  ncclComm_t comm = group_comms_[c.group];
  if (!comm) {
    throw ExecError(ctx_.where() + ": rank " + std::to_string(rank_) +
                    " has no communicator for group '" + group.name + "'");
  }
  const ncclDataType_t type = nccl_type(c.dtype, ctx_);
  const std::int64_t member = std::max(plan_.member_index(c.group, rank_), 0);
  std::int64_t done = 0;
  do {
    const std::int64_t units = std::min(chunk_units, total_units - done);
    const auto count = static_cast<std::size_t>(units);
    const std::int64_t slice = units * esize;  // bytes of one member's part
    switch (c.kind) {
      case CollectiveKind::all_reduce:
        STRATASIM_NCCL_ENQUEUE(comm, ncclAllReduce(buffer, buffer, count, type, ncclSum, comm, st));
        break;
      case CollectiveKind::reduce_scatter:
        STRATASIM_NCCL_ENQUEUE(comm, ncclReduceScatter(buffer, buffer + member * slice, count, type,
                                                       ncclSum, comm, st));
        break;
      case CollectiveKind::all_gather:
        STRATASIM_NCCL_ENQUEUE(
            comm, ncclAllGather(buffer + member * slice, buffer, count, type, comm, st));
        break;
      case CollectiveKind::broadcast:
        STRATASIM_NCCL_ENQUEUE(comm, ncclBroadcast(buffer, buffer, count, type, 0, comm, st));
        break;
      case CollectiveKind::reduce:
        STRATASIM_NCCL_ENQUEUE(comm, ncclReduce(buffer, buffer, count, type, ncclSum, 0, comm, st));
        break;
      case CollectiveKind::all_to_all: {
        STRATASIM_CUDA_CHECK(ctx_, ncclGroupStart());
        for (std::int64_t p = 0; p < n; ++p) {
          STRATASIM_CUDA_CHECK(
              ctx_, ncclSend(buffer + p * slice, count, type, static_cast<int>(p), comm, st));
          STRATASIM_CUDA_CHECK(
              ctx_, ncclRecv(second + p * slice, count, type, static_cast<int>(p), comm, st));
        }
        STRATASIM_NCCL_ENQUEUE(comm, ncclGroupEnd());
        break;
      }
    }
    done += units;
  } while (done < total_units);
  return needs;
}

CudaRankDevice::Needs CudaRankDevice::run_transfer(int peer, Bytes bytes, bool send,
                                                   const Arena* arena, cudaStream_t st) {
  const std::int64_t total = std::max<std::int64_t>(bytes.count(), 0);
  const std::int64_t chunk = std::max<std::int64_t>(1, std::min(total, kBufferCap));
  Carve work{arena ? arena->device + arena->in_bytes : nullptr};
  char* buffer = work.take(chunk);
  const Needs needs{0, work.used, 0};
  if (!arena) return needs;
  const auto it = p2p_.find(send ? std::pair(rank_, peer) : std::pair(peer, rank_));
  if (it == p2p_.end()) {
    throw ExecError(ctx_.where() + ": no communicator for transfers " +
                    (send ? "to rank " : "from rank ") + std::to_string(peer));
  }
  ncclComm_t comm = it->second;
  std::int64_t done = 0;
  do {
    const auto count = static_cast<std::size_t>(std::min(chunk, total - done));
    if (send) {
      STRATASIM_NCCL_ENQUEUE(comm, ncclSend(buffer, count, ncclUint8, 1, comm, st));
    } else {
      STRATASIM_NCCL_ENQUEUE(comm, ncclRecv(buffer, count, ncclUint8, 0, comm, st));
    }
    done += chunk;
  } while (done < total);
  return needs;
}

// ---- Waiting.

bool CudaRankDevice::poll() {
  bool progress = false;
  for (int s : used_streams_) {
    const auto& q = queues_[static_cast<std::size_t>(s)];
    std::size_t& head = heads_[static_cast<std::size_t>(s)];
    while (head < q.size()) {
      const std::uint32_t i = q[head];
      const cudaError_t status = cudaEventQuery(end_event(i));
      if (status == cudaErrorNotReady) {
        (void)cudaGetLastError();
        break;
      }
      if (status != cudaSuccess) {
        ctx_.op = first_ + i;
        check_call(status, "cudaEventQuery (an op's end)", ctx_);
      }
      state_[i].done = true;
      --unfinished_;
      ++head;
      progress = true;
    }
  }
  return progress;
}

bool CudaRankDevice::synchronize(std::chrono::milliseconds watchdog) {
  STRATASIM_CUDA_CHECK(ctx_, cudaSetDevice(setup_.gpu));
  auto last_progress = Clock::now();
  for (;;) {
    if (host_errors_->failed) {
      throw ExecError(ctx_.where() + ": a host optimizer step failed: " + host_errors_->get());
    }
    if (poll()) last_progress = Clock::now();
    if (unfinished_ == 0) return true;
    for (const Comm& c : comms_) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t status = ncclCommGetAsyncError(c.comm, &state);
      if (status != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
        const ncclResult_t bad = status != ncclSuccess ? status : state;
        pending_ = snapshot();
        const std::string message = ctx_.where() + ": NCCL communicator of " + c.name +
                                    " failed: " + ncclGetErrorString(bad) + ": " +
                                    ncclGetLastError(c.comm);
        abort_communicators();
        throw ExecError(message);
      }
    }
    if (aborted() || Clock::now() - last_progress >= watchdog) {
      pending_ = snapshot();
      abort_communicators();
      return false;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::string CudaRankDevice::waiting_for(OpId id) const {
  const Op& op = program_.op(id);
  for (OpId d : program_.deps_of(op)) {
    const OpState& ds = state_[local(d)];
    if (!ds.enqueued) return "waiting for " + program_.describe(d) + ", not yet enqueued";
    if (!ds.done && cudaEventQuery(end_event(local(d))) != cudaSuccess) {
      (void)cudaGetLastError();
      return "waiting for " + program_.describe(d);
    }
  }
  const std::string k = "#" + std::to_string(plan_.sequence(id));
  if (const auto* c = std::get_if<Collective>(&op.work)) {
    return "NCCL " + std::string(name_of(c->kind)) + " on '" + program_.groups()[c->group].name +
           "' (collective " + k + "), " + to_string(c->bytes) + ": waiting for its members";
  }
  if (const auto* s = std::get_if<Send>(&op.work)) {
    return "ncclSend to rank " + std::to_string(s->peer) + " (" + k + "), " + to_string(s->bytes) +
           ": waiting for rank " + std::to_string(s->peer) + "'s receive";
  }
  if (const auto* r = std::get_if<Recv>(&op.work)) {
    return "ncclRecv from rank " + std::to_string(r->peer) + " (" + k + "), " +
           to_string(r->bytes) + ": waiting for rank " + std::to_string(r->peer) + "'s send";
  }
  const auto& c = std::get<Compute>(op.work);
  const auto& kernels = program_.kernels_of(c);
  const OpState& s = state_[local(id)];
  for (std::uint32_t k2 = 0; k2 < kernels.size(); ++k2) {
    if (cudaEventQuery(event(s.first_event + k2 + 1)) != cudaSuccess) {
      (void)cudaGetLastError();
      return "running kernel '" + kernels[k2].name + "' (" + std::to_string(k2 + 1) + " of " +
             std::to_string(kernels.size()) + ") on the GPU";
    }
  }
  return "running on the GPU";
}

std::vector<PendingOp> CudaRankDevice::snapshot() const {
  std::vector<PendingOp> heads, rest;
  for (int s : used_streams_) {
    const auto& q = queues_[static_cast<std::size_t>(s)];
    const std::size_t head = heads_[static_cast<std::size_t>(s)];
    for (std::size_t j = head; j < q.size(); ++j) {
      const OpId id = first_ + q[j];
      if (j == head) {
        heads.push_back({id, waiting_for(id)});
      } else {
        rest.push_back({id, "queued on stream " + std::string(name_of(static_cast<Stream>(s))) +
                                " behind op " + std::to_string(q[head])});
      }
    }
    for (OpId id : deferred_[static_cast<std::size_t>(s)]) {
      rest.push_back({id, "not enqueued: a dependency was never issued"});
    }
  }
  heads.insert(heads.end(), rest.begin(), rest.end());
  return heads;
}

void CudaRankDevice::abort_communicators() noexcept {
  if (comms_aborted_) return;
  comms_aborted_ = true;
  for (auto it = comms_.rbegin(); it != comms_.rend(); ++it) (void)ncclCommAbort(it->comm);
  comms_.clear();
  group_comms_.assign(group_comms_.size(), nullptr);
  p2p_.clear();
  world_comm_ = nullptr;
}

Time CudaRankDevice::elapsed(cudaEvent_t e) const {
  float ms = 0.0f;
  STRATASIM_CUDA_CHECK(ctx_, cudaEventElapsedTime(&ms, start_event_, e));
  return Time::from_seconds(std::max(0.0, static_cast<double>(ms) * 1e-3));
}

RankMeasurement CudaRankDevice::measurement() const {
  RankMeasurement m;
  m.rank = rank_;
  m.ops.reserve(count_);
  std::vector<Time> starts(count_), ends(count_);
  for (std::uint32_t i = 0; i < count_; ++i) {
    const OpState& s = state_[i];
    if (!s.done) {
      throw ExecError(ctx_.where() + ": measurement() before " + program_.describe(first_ + i) +
                      " finished");
    }
    starts[i] = elapsed(event(s.first_event));
    ends[i] = elapsed(end_event(i));
    m.ops.push_back({first_ + i, starts[i], ends[i]});
    if (s.events > 1 && std::holds_alternative<Compute>(program_.op(first_ + i).work)) {
      Time previous = starts[i];
      for (std::uint32_t k = 0; k + 1 < s.events; ++k) {
        const Time end = elapsed(event(s.first_event + k + 1));
        m.kernels.push_back({first_ + i, k, previous, end});
        previous = end;
      }
    }
  }
  const auto time_of = [&](const EffectRecord& e) {
    if (e.when == When::initial) return Time();
    return e.when == When::start ? starts[local(e.op)] : ends[local(e.op)];
  };
  for (int t = 0; t < kMemoryTierCount; ++t) {
    traces::TierPeak peak = pools_[static_cast<std::size_t>(t)]->peak();
    const std::int64_t source = peak_effect_[static_cast<std::size_t>(t)];
    if (source >= 0) peak.time = time_of(effects_[static_cast<std::size_t>(source)]);
    m.memory.tiers[static_cast<std::size_t>(t)] = peak;
  }
  m.samples.reserve(effects_.size());
  for (const EffectRecord& e : effects_) {
    m.samples.push_back({rank_, e.tier, time_of(e), e.total, e.op});
  }
  std::stable_sort(
      m.samples.begin(), m.samples.end(),
      [](const traces::MemorySample& a, const traces::MemorySample& b) { return a.time < b.time; });
  std::uint64_t reserved = 0;
  STRATASIM_CUDA_CHECK(
      ctx_, cudaMemPoolGetAttribute(mem_pool_, cudaMemPoolAttrReservedMemHigh, &reserved));
  m.reserved_peak = Bytes(static_cast<std::int64_t>(reserved));
  return m;
}

// Frees everything; on a failed or aborted run, communicators are aborted instead of finalised
// (their peers may never take part again).
void CudaRankDevice::release(bool abort) noexcept {
  (void)cudaSetDevice(setup_.gpu);
  const auto drain = [this](std::chrono::seconds limit) {
    const auto start = Clock::now();
    for (int s : used_streams_) {
      cudaStream_t st = streams_[static_cast<std::size_t>(s)];
      while (st && cudaStreamQuery(st) == cudaErrorNotReady) {
        if (Clock::now() - start > limit) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
    (void)cudaGetLastError();
    return true;
  };
  abort = abort || aborted();
  if (!comms_aborted_ && !comms_.empty()) {
    if (abort || !drain(std::chrono::duration_cast<std::chrono::seconds>(kTeardownTimeout))) {
      abort_communicators();
    } else {
      // Finalise in the reverse order of creation, the same on every rank.
      while (!comms_.empty()) {
        ncclComm_t comm = comms_.back().comm;
        ncclResult_t status = ncclCommFinalize(comm);
        const auto start = Clock::now();
        ncclResult_t state = status;
        while (status == ncclSuccess || status == ncclInProgress) {
          if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
          if (state != ncclInProgress || aborted() || Clock::now() - start > kTeardownTimeout) {
            break;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        if (status != ncclSuccess && status != ncclInProgress) state = status;
        if (state != ncclSuccess) {
          abort_communicators();
          break;
        }
        (void)ncclCommDestroy(comm);
        comms_.pop_back();
      }
      comms_.clear();
    }
  }
  drain(std::chrono::seconds(10));

  current_stream_ = first_stream_;
  for (auto& pool : pools_) pool.reset();
  pinned_.reset();
  matmuls_.reset();
  if (lt_) cublasLtDestroy(lt_);
  lt_ = nullptr;
  if (workspace_) cudaFree(workspace_);
  workspace_ = nullptr;
  for (Arena& a : arenas_) {
    if (a.device) cudaFree(a.device);
    if (a.host) cudaFreeHost(a.host);
    a.device = a.host = nullptr;
  }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  events_.clear();
  if (start_event_) cudaEventDestroy(start_event_);
  start_event_ = nullptr;
  for (cudaStream_t& st : streams_) {
    if (st) cudaStreamDestroy(st);
    st = nullptr;
  }
  if (mem_pool_) cudaMemPoolDestroy(mem_pool_);
  mem_pool_ = nullptr;
  (void)cudaGetLastError();
}

}  // namespace

DeviceSetup device_setup(const ExecPlan& plan, int rank, int gpu, const ncclUniqueId& id,
                         const WorldOptions& options, int ranks_in_process,
                         std::function<bool()> aborted) {
  DeviceSetup setup;
  setup.plan = &plan;
  setup.rank = rank;
  setup.gpu = gpu;
  setup.nccl_id = id;
  setup.capacity = options.capacity;
  setup.options = options.device;
  setup.aborted = std::move(aborted);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  setup.host_threads = std::max(1, cores / std::max(1, ranks_in_process));
  return setup;
}

std::unique_ptr<RankDevice> make_cuda_device(const DeviceSetup& setup) {
  return std::make_unique<CudaRankDevice>(setup);
}

void prepare_nccl_environment() {
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
}

}  // namespace stratasim::exec::cuda
