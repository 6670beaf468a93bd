// A device profile fitted from a Kineto trace's kernels (traces/kineto_profile.hpp says which
// figures and how).
#include "traces/kineto_profile.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "hw_models/config_reader.hpp"
#include "hw_models/json_depth.hpp"
#include "strategies/program.hpp"
#include "traces/import.hpp"

namespace stratasim::traces {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr double kMaxMicros = 1e12;     // a duration: 11.6 days
constexpr double kMaxTimestamp = 1e17;  // microseconds since the epoch, or since the trace began
constexpr double kNestSlackUs = 1e-3;   // Kineto writes microseconds with 3 decimals
constexpr std::int64_t kMaxDim = kMaxTraceDim;

// ---- What the trace's "Input type" names mean (c10's type names of tensor dtypes). Every other
// entry ("Scalar", "TensorList", "GenericList", "" for None) is not a tensor.

struct Element {
  std::int64_t bytes = 0;
  std::optional<DType> dtype;  // the profile's dtype, for floating-point types
};

std::optional<Element> tensor_element(std::string_view type) {
  static const std::map<std::string, Element, std::less<>> kTypes = {
      {"float", {4, DType::fp32}},
      {"c10::Half", {2, DType::fp16}},
      {"c10::BFloat16", {2, DType::bf16}},
      {"c10::Float8_e4m3fn", {1, DType::fp8}},
      {"c10::Float8_e5m2", {1, DType::fp8}},
      {"c10::Float8_e4m3fnuz", {1, DType::fp8}},
      {"c10::Float8_e5m2fnuz", {1, DType::fp8}},
      {"double", {8, std::nullopt}},
      {"int", {4, std::nullopt}},
      {"long int", {8, std::nullopt}},
      {"long unsigned int", {8, std::nullopt}},
      {"unsigned int", {4, std::nullopt}},
      {"short unsigned int", {2, std::nullopt}},
      {"short int", {2, std::nullopt}},
      {"signed char", {1, std::nullopt}},
      {"unsigned char", {1, std::nullopt}},
      {"bool", {1, std::nullopt}},
      {"c10::complex<float>", {8, std::nullopt}},
      {"c10::complex<double>", {16, std::nullopt}},
      {"c10::complex<c10::Half>", {4, std::nullopt}},
  };
  auto it = kTypes.find(type);
  if (it == kTypes.end()) return std::nullopt;
  return it->second;
}

// ---- Operators.

enum class GemmForm { mm, addmm, scaled_mm, bmm, baddbmm, matmul, linear };

const std::map<std::string, GemmForm, std::less<>>& gemm_ops() {
  static const std::map<std::string, GemmForm, std::less<>> kOps = {
      {"aten::mm", GemmForm::mm},
      {"aten::addmm", GemmForm::addmm},
      {"aten::_scaled_mm", GemmForm::scaled_mm},
      {"aten::bmm", GemmForm::bmm},
      {"aten::baddbmm", GemmForm::baddbmm},
      {"aten::matmul", GemmForm::matmul},
      {"aten::linear", GemmForm::linear}};
  return kOps;
}

struct AttentionForm {
  bool bhsd = true;        // q and k as [b, h, s, d]; else [b, s, h, d]
  int q = 0, k = 1;        // input indices
  int causal = 0;          // input index of is_causal (or custom_mask_type)
  bool mask_type = false;  // causal is an int: custom_mask_type, 0 = none
  bool backward = false;
  int varlen = -1;  // input index of cum_seq_q / cu_seqlens_q, or -1
};

const std::map<std::string, AttentionForm, std::less<>>& attention_ops() {
  // Argument positions from PyTorch's aten/src/ATen/native/native_functions.yaml.
  static const std::map<std::string, AttentionForm, std::less<>> kOps = {
      {"aten::_scaled_dot_product_flash_attention", {true, 0, 1, 4, false, false, -1}},
      {"aten::_scaled_dot_product_flash_attention_backward", {true, 1, 2, 11, false, true, -1}},
      {"aten::_scaled_dot_product_efficient_attention", {true, 0, 1, 6, false, false, -1}},
      {"aten::_scaled_dot_product_efficient_attention_backward", {true, 1, 2, 11, false, true, -1}},
      {"aten::_scaled_dot_product_cudnn_attention", {true, 0, 1, 6, false, false, -1}},
      {"aten::_flash_attention_forward", {false, 0, 1, 8, false, false, 3}},
      {"aten::_flash_attention_backward", {false, 1, 2, 11, false, true, 6}},
      {"aten::_efficient_attention_forward", {false, 0, 1, 9, true, false, 4}},
      {"aten::_efficient_attention_backward", {false, 1, 2, 14, true, true, 6}},
  };
  return kOps;
}

enum class MemoryForm { map, norm, in_place, overwrite };

const std::map<std::string, MemoryForm, std::less<>>& memory_ops() {
  static const std::map<std::string, MemoryForm, std::less<>> kOps = [] {
    std::map<std::string, MemoryForm, std::less<>> ops;
    for (const char* name : {"add",
                             "sub",
                             "mul",
                             "div",
                             "neg",
                             "exp",
                             "sqrt",
                             "rsqrt",
                             "pow",
                             "where",
                             "gelu",
                             "silu",
                             "relu",
                             "tanh",
                             "sigmoid",
                             "softmax",
                             "_softmax",
                             "log_softmax",
                             "_log_softmax",
                             "gelu_backward",
                             "silu_backward",
                             "threshold_backward",
                             "tanh_backward",
                             "sigmoid_backward",
                             "_softmax_backward_data",
                             "_log_softmax_backward_data"}) {
      ops.emplace(std::string("aten::") + name, MemoryForm::map);
    }
    for (const char* name : {"layer_norm", "native_layer_norm"}) {
      ops.emplace(std::string("aten::") + name, MemoryForm::norm);
    }
    for (const char* name : {"add_", "sub_", "mul_", "div_", "addcmul_", "addcdiv_", "lerp_"}) {
      ops.emplace(std::string("aten::") + name, MemoryForm::in_place);
    }
    for (const char* name : {"copy_", "fill_", "zero_"}) {
      ops.emplace(std::string("aten::") + name, MemoryForm::overwrite);
    }
    return ops;
  }();
  return kOps;
}

enum class OpClass { none, gemm, attention, memory };

OpClass class_of(std::string_view name) {
  if (gemm_ops().count(name)) return OpClass::gemm;
  if (attention_ops().count(name)) return OpClass::attention;
  if (memory_ops().count(name)) return OpClass::memory;
  return OpClass::none;
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

Time duration_of(double micros) {
  return Time::ps(std::llround(micros * 1e6));
}

// ---- Reading events, with errors at their JSON path.

struct Reader {
  const std::string& file;
  [[noreturn]] void fail(const std::string& path, const std::string& message) const {
    throw TraceError(file, path, message);
  }
  double number(const json& e, const char* key, const std::string& path, double lo,
                double hi) const {
    auto it = e.find(key);
    if (it == e.end() || !it->is_number() || !std::isfinite(it->get<double>()) ||
        it->get<double>() < lo || it->get<double>() > hi) {
      fail(path + "." + key, "expected a number from " +
                                 std::to_string(static_cast<std::int64_t>(lo)) + " to " +
                                 std::to_string(static_cast<std::int64_t>(hi)));
    }
    return it->get<double>();
  }
};

std::optional<std::int64_t> integer_arg(const json* args, const char* key) {
  if (!args) return std::nullopt;
  auto it = args->find(key);
  if (it == args->end() || !it->is_number_integer()) return std::nullopt;
  return it->get<std::int64_t>();
}

std::string thread_key(const json& e) {
  auto part = [&](const char* key) {
    auto it = e.find(key);
    return it == e.end() ? std::string("-") : it->dump();
  };
  return part("pid") + "/" + part("tid");
}

struct CpuOp {
  std::size_t index = 0;  // in traceEvents
  std::string name;
  double ts = 0, end = 0;
  std::string thread;
  const json* args = nullptr;
  std::size_t parent = std::numeric_limits<std::size_t>::max();
};

constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

struct Launch {
  double ts = 0;
  std::string thread;
  std::optional<std::int64_t> external;
};

// ---- An operator's inputs as the trace records them.

struct Inputs {
  const json* dims = nullptr;      // "Input Dims"
  const json* types = nullptr;     // "Input type"
  const json* concrete = nullptr;  // "Concrete Inputs"

  std::size_t size() const { return types ? types->size() : 0; }
  std::optional<Element> element(std::size_t i) const {
    if (!types || i >= types->size() || !(*types)[i].is_string()) return std::nullopt;
    return tensor_element((*types)[i].get_ref<const std::string&>());
  }
  bool is_tensor(std::size_t i) const { return element(i).has_value(); }
  // A tensor input's dims; nullopt when the input is not a tensor or its dims are unreadable.
  std::optional<std::vector<std::int64_t>> shape(std::size_t i) const {
    if (!is_tensor(i) || !dims || i >= dims->size() || !(*dims)[i].is_array()) {
      return std::nullopt;
    }
    std::vector<std::int64_t> out;
    for (const json& d : (*dims)[i]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0 || d.get<std::int64_t>() > kMaxDim) {
        return std::nullopt;
      }
      out.push_back(d.get<std::int64_t>());
    }
    return out;
  }
  std::optional<std::string> concrete_at(std::size_t i) const {
    if (!concrete || i >= concrete->size() || !(*concrete)[i].is_string()) return std::nullopt;
    return (*concrete)[i].get<std::string>();
  }
};

// Elements of a shape; nullopt past 2^62.
std::optional<std::int64_t> elements(const std::vector<std::int64_t>& shape, std::size_t from = 0,
                                     std::size_t to = std::string::npos) {
  to = std::min(to, shape.size());
  std::int64_t n = 1;
  for (std::size_t i = from; i < to; ++i) {
    if (shape[i] != 0 && n > (std::int64_t{1} << 62) / shape[i]) return std::nullopt;
    n *= shape[i];
  }
  return n;
}

// The broadcast of two shapes (numpy rules), or nullopt.
std::optional<std::vector<std::int64_t>> broadcast(const std::vector<std::int64_t>& a,
                                                   const std::vector<std::int64_t>& b) {
  std::vector<std::int64_t> out(std::max(a.size(), b.size()), 1);
  for (std::size_t i = 0; i < out.size(); ++i) {
    const std::int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1;
    const std::int64_t y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[out.size() - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

struct Fitted {
  std::optional<strategies::Gemm> gemm;
  std::optional<strategies::Attention> attention;
  std::optional<Bytes> bytes;
  std::string skip;  // why not, when none is set
};

Fitted skip(std::string why) {
  Fitted f;
  f.skip = std::move(why);
  return f;
}

Fitted fit_gemm(GemmForm form, const Inputs& in) {
  const std::size_t ia = form == GemmForm::addmm || form == GemmForm::baddbmm ? 1 : 0;
  const auto a = in.shape(ia), b = in.shape(ia + 1);
  if (!a || !b) return skip("operand shapes not recorded as tensors");
  const auto type = in.element(ia);
  if (!type->dtype) {
    return skip("dtype " + (*in.types)[ia].get<std::string>() + " has no profile dtype");
  }
  strategies::Gemm g;
  g.dtype = *type->dtype;
  const auto& A = *a;
  const auto& B = *b;
  auto mismatch = [] { return skip("operand shapes do not multiply"); };
  switch (form) {
    case GemmForm::mm:
    case GemmForm::addmm:
    case GemmForm::scaled_mm:
      if (A.size() != 2 || B.size() != 2 || A[1] != B[0]) return mismatch();
      g.m = A[0], g.k = A[1], g.n = B[1], g.batch = 1;
      break;
    case GemmForm::bmm:
    case GemmForm::baddbmm:
      if (A.size() != 3 || B.size() != 3 || A[0] != B[0] || A[2] != B[1]) return mismatch();
      g.batch = A[0], g.m = A[1], g.k = A[2], g.n = B[2];
      break;
    case GemmForm::linear: {
      // input [..., k], weight [n, k]
      if (A.empty() || B.size() != 2 || A.back() != B[1]) return mismatch();
      const auto m = elements(A, 0, A.size() - 1);
      if (!m) return mismatch();
      g.m = *m, g.k = A.back(), g.n = B[0], g.batch = 1;
      break;
    }
    case GemmForm::matmul: {
      if (A.empty() || B.empty()) return mismatch();
      g.k = A.back();
      const std::int64_t b_k = B.size() == 1 ? B[0] : B[B.size() - 2];
      if (b_k != g.k) return mismatch();
      g.n = B.size() == 1 ? 1 : B.back();
      if (B.size() <= 2) {
        // A's leading dims fold into m.
        const auto m = elements(A, 0, A.size() - 1);
        if (!m) return mismatch();
        g.m = *m, g.batch = 1;
      } else {
        g.m = A.size() >= 2 ? A[A.size() - 2] : 1;
        const std::vector<std::int64_t> lead_a(
            A.begin(), A.end() - std::min<std::ptrdiff_t>(2, std::ssize(A)));
        const std::vector<std::int64_t> lead_b(B.begin(), B.end() - 2);
        const auto lead = broadcast(lead_a, lead_b);
        if (!lead) return mismatch();
        const auto batch = elements(*lead);
        if (!batch) return mismatch();
        g.batch = *batch;
      }
      break;
    }
  }
  if (g.m < 1 || g.n < 1 || g.k < 1 || g.batch < 1) return skip("an empty GEMM");
  if (g.m > kMaxDim || g.n > kMaxDim || g.batch > kMaxDim) return skip("a dimension above 2^40");
  Fitted f;
  f.gemm = g;
  return f;
}

Fitted fit_attention(const AttentionForm& form, const Inputs& in) {
  const auto q = in.shape(static_cast<std::size_t>(form.q));
  const auto k = in.shape(static_cast<std::size_t>(form.k));
  if (!q || !k || q->size() != 4 || k->size() != 4) {
    return skip("query and key shapes not recorded as 4-D tensors");
  }
  if (form.varlen >= 0 && in.is_tensor(static_cast<std::size_t>(form.varlen))) {
    return skip("variable-length (packed) sequences");
  }
  const auto type = in.element(static_cast<std::size_t>(form.q));
  if (!type->dtype) {
    return skip("dtype " + (*in.types)[static_cast<std::size_t>(form.q)].get<std::string>() +
                " has no profile dtype");
  }
  const auto flag = in.concrete_at(static_cast<std::size_t>(form.causal));
  if (!flag || flag->empty()) {
    return skip("is_causal not recorded (\"Concrete Inputs\" is written by PyTorch 2.2 and later)");
  }
  bool causal = false;
  if (form.mask_type) {
    causal = *flag != "0";
  } else if (*flag == "True" || *flag == "true" || *flag == "1") {
    causal = true;
  } else if (*flag != "False" && *flag != "false" && *flag != "0") {
    return skip("is_causal recorded as \"" + *flag + "\"");
  }
  const auto& Q = *q;
  const auto& K = *k;
  strategies::Attention a;
  a.batch = Q[0];
  a.head_dim = Q[3];
  if (form.bhsd) {
    a.heads = Q[1], a.seq_q = Q[2], a.kv_heads = K[1], a.seq_kv = K[2];
  } else {
    a.seq_q = Q[1], a.heads = Q[2], a.seq_kv = K[1], a.kv_heads = K[2];
  }
  a.causal = causal;
  a.dtype = *type->dtype;
  a.backward = form.backward;
  if (a.batch < 1 || a.heads < 1 || a.seq_q < 1 || a.seq_kv < 1 || a.head_dim < 1) {
    return skip("an empty attention");
  }
  Fitted f;
  f.attention = a;
  return f;
}

Fitted fit_memory(MemoryForm form, const Inputs& in) {
  std::vector<std::size_t> tensors;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in.is_tensor(i)) tensors.push_back(i);
  }
  if (tensors.empty()) return skip("no tensor inputs recorded");
  // A tensor's bytes; nullopt when unreadable or beyond kMaxTraceBytes.
  auto bytes_of = [&](std::size_t i) -> std::optional<std::int64_t> {
    const auto s = in.shape(i);
    if (!s) return std::nullopt;
    const auto n = elements(*s);
    if (!n || *n > kMaxTraceBytes / in.element(i)->bytes) return std::nullopt;
    return *n * in.element(i)->bytes;
  };
  std::int64_t read = 0, written = 0;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto b = bytes_of(tensors[t]);
    if (!b) return skip("tensor shapes not recorded (or beyond 2^56 bytes)");
    if (t == 0 && form == MemoryForm::overwrite) continue;  // self is only written
    read += *b;
    if (read > kMaxTraceBytes) return skip("more than 2^56 bytes");
  }
  const std::size_t first = tensors.front();
  switch (form) {
    case MemoryForm::in_place:
    case MemoryForm::overwrite:
    case MemoryForm::norm:
      written = *bytes_of(first);
      break;
    case MemoryForm::map: {
      std::vector<std::int64_t> shape = *in.shape(first);
      std::int64_t element = 0;
      for (std::size_t i : tensors) {
        const auto s = broadcast(shape, *in.shape(i));
        if (!s) return skip("input shapes do not broadcast");
        shape = *s;
        element = std::max(element, in.element(i)->bytes);
      }
      const auto n = elements(shape);
      if (!n || *n > kMaxTraceBytes / element) return skip("more than 2^56 bytes");
      written = *n * element;
      break;
    }
  }
  Fitted f;
  f.bytes = Bytes(read + written);
  return f;
}

std::string top_names(const std::map<std::string, std::int64_t>& counts, std::size_t k) {
  std::vector<std::pair<std::int64_t, std::string>> v;
  for (const auto& [name, n] : counts) v.emplace_back(-n, name);
  std::sort(v.begin(), v.end());
  std::string out;
  for (std::size_t i = 0; i < v.size() && i < k; ++i) {
    out += (i ? ", " : "") + v[i].second + " " + std::to_string(-v[i].first);
  }
  if (v.size() > k) out += ", ...";
  return out;
}

// The device's peak for `t`, or nullopt when it has none (an FPGA without that datapath).
std::optional<FlopRate> peak_of(const hw::DeviceSpec& device, DType t) {
  try {
    return device.peak(t);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
}

bool is_launch_call(std::string_view name) {
  static const std::set<std::string, std::less<>> kNames = {
      "cudaLaunchKernel",   "cudaLaunchKernelExC",  "cudaLaunchCooperativeKernel",
      "cuLaunchKernel",     "cuLaunchKernelEx",     "hipLaunchKernel",
      "hipExtLaunchKernel", "hipModuleLaunchKernel"};
  return kNames.count(name) > 0;
}

// ---- The trace's events, sorted by what they are.

struct KernelEvent {
  std::size_t index;
  double dur;
  const json* args;
};

struct CopyEvent {
  std::size_t index;
  double dur;
  std::string name;
  const json* args;
};

struct Events {
  std::string base = "traceEvents";  // the events' JSON path ("" for a bare array)
  std::vector<CpuOp> ops;
  std::unordered_map<std::int64_t, std::vector<std::size_t>> op_by_external;
  std::unordered_map<std::int64_t, Launch> launch_by_correlation;
  std::vector<Time> launch_times;
  std::vector<KernelEvent> kernels;
  std::vector<CopyEvent> copies;

  std::string path_of(std::size_t i) const { return base + "[" + std::to_string(i) + "]"; }
};

json parse_document(const Reader& in, const std::string& text) {
  try {
    return config::parse_json_depth_bounded(text, in.file);
  } catch (const config::ConfigError& e) {  // nested deeper than config::kMaxJsonDepth
    in.fail("", e.message());
  } catch (const json::exception& e) {
    in.fail("", std::string("not valid JSON: ") + e.what());
  }
}

// The trace's event array; `base` becomes its JSON path.
const json& trace_events(const Reader& in, const json& doc, std::string& base) {
  if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array()) {
    base = "traceEvents";
    return doc["traceEvents"];
  }
  if (doc.is_array()) {
    base = "";
    return doc;
  }
  in.fail("traceEvents",
          "not a PyTorch profiler (Kineto) trace: expected an object with a \"traceEvents\" "
          "array (torch.profiler's export_chrome_trace writes one)");
}

// deviceProperties[0].name, or "".
std::string gpu_name(const json& doc) {
  if (doc.is_object()) {
    if (auto p = doc.find("deviceProperties");
        p != doc.end() && p->is_array() && !p->empty() && (*p)[0].is_object()) {
      if (auto n = (*p)[0].find("name"); n != (*p)[0].end() && n->is_string()) {
        return n->get<std::string>();
      }
    }
  }
  return "";
}

// A string member, or "" when it is missing or not a string.
std::string string_member(const json& e, const char* key) {
  auto it = e.find(key);
  return it != e.end() && it->is_string() ? it->get<std::string>() : "";
}

void read_cpu_op(const Reader& in, const json& e, std::size_t i, const std::string& ev_name,
                 const json* args, Events& ev) {
  const std::string path = ev.path_of(i);
  CpuOp op;
  op.index = i;
  op.name = ev_name;
  op.ts = in.number(e, "ts", path, -kMaxTimestamp, kMaxTimestamp);
  op.end = op.ts + in.number(e, "dur", path, 0, kMaxMicros);
  op.thread = thread_key(e);
  op.args = args;
  if (const auto ext = integer_arg(args, "External id")) {
    ev.op_by_external[*ext].push_back(ev.ops.size());
  }
  ev.ops.push_back(std::move(op));
}

void read_runtime_call(const Reader& in, const json& e, const std::string& path,
                       const std::string& ev_name, const json* args, Events& ev) {
  const double ts = in.number(e, "ts", path, -kMaxTimestamp, kMaxTimestamp);
  const double dur = in.number(e, "dur", path, 0, kMaxMicros);
  if (!is_launch_call(ev_name)) return;
  ev.launch_times.push_back(duration_of(dur));
  if (const auto corr = integer_arg(args, "correlation")) {
    ev.launch_by_correlation[*corr] = {ts, thread_key(e), integer_arg(args, "External id")};
  }
}

void read_kernel(const Reader& in, const json& e, std::size_t i, const std::string& ev_name,
                 const json* args, Events& ev, TraceCalibration& result) {
  const std::string path = ev.path_of(i);
  ++result.kernels;
  in.number(e, "ts", path, -kMaxTimestamp, kMaxTimestamp);
  const double dur = in.number(e, "dur", path, 0, kMaxMicros);
  if (ev_name.rfind("ncclKernel", 0) == 0 || ev_name.rfind("ncclDevKernel", 0) == 0 ||
      (args && args->contains("Collective name"))) {
    ++result.skipped["collectives: NCCL kernels (not fitted: they wait for other ranks)"];
    return;
  }
  ev.kernels.push_back({i, dur, args});
}

// One trace event: a CPU operator, a launch call or device activity; others are ignored.
void read_event(const Reader& in, const json& e, std::size_t i, Events& ev,
                TraceCalibration& result) {
  if (!e.is_object()) in.fail(ev.path_of(i), "expected an object (a trace event)");
  auto ph = e.find("ph");
  if (ph == e.end() || !ph->is_string() || ph->get_ref<const std::string&>() != "X") return;
  const std::string cat = lower(string_member(e, "cat"));
  const std::string ev_name = string_member(e, "name");
  auto args_it = e.find("args");
  const json* args = args_it != e.end() && args_it->is_object() ? &*args_it : nullptr;
  const std::string path = ev.path_of(i);
  if (cat == "cpu_op" || cat == "operator") {
    read_cpu_op(in, e, i, ev_name, args, ev);
  } else if (cat == "cuda_runtime" || cat == "cuda_driver" || cat == "runtime" ||
             cat == "hip_runtime") {
    read_runtime_call(in, e, path, ev_name, args, ev);
  } else if (cat == "kernel") {
    read_kernel(in, e, i, ev_name, args, ev, result);
  } else if (cat == "gpu_memcpy" || cat == "memcpy") {
    ++result.kernels;
    ev.copies.push_back({i, in.number(e, "dur", path, 0, kMaxMicros), ev_name, args});
  } else if (cat == "gpu_memset" || cat == "memset") {
    ++result.kernels;
    ++result.skipped["copies: memsets"];
  }
}

// One pass: CPU operators, launch calls, device activity.
Events read_events(const Reader& in, const json& events, const std::string& base,
                   TraceCalibration& result) {
  Events ev;
  ev.base = base;
  for (std::size_t i = 0; i < events.size(); ++i) read_event(in, events[i], i, ev, result);
  if (ev.kernels.empty() && ev.copies.empty()) {
    in.fail(base,
            "no GPU kernels (events of cat \"kernel\"): record the trace with "
            "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]");
  }
  return ev;
}

// CPU operators nest by time on their thread: each one's parent is the innermost operator
// enclosing it.
void nest_operators(std::vector<CpuOp>& ops) {
  std::vector<std::size_t> order(ops.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    if (ops[x].thread != ops[y].thread) return ops[x].thread < ops[y].thread;
    if (ops[x].ts != ops[y].ts) return ops[x].ts < ops[y].ts;
    return ops[x].end > ops[y].end;
  });
  std::vector<std::size_t> stack;
  for (std::size_t i : order) {
    CpuOp& op = ops[i];
    while (!stack.empty() && (ops[stack.back()].thread != op.thread ||
                              op.end > ops[stack.back()].end + kNestSlackUs)) {
      stack.pop_back();
    }
    if (!stack.empty()) op.parent = stack.back();
    stack.push_back(i);
  }
}

// ---- Each kernel to its operator, and to its call.

// The operator that launched a kernel, or kNone.
std::size_t operator_of(const Events& ev, const KernelEvent& k) {
  std::optional<std::int64_t> external = integer_arg(k.args, "External id");
  const Launch* launch = nullptr;
  if (const auto corr = integer_arg(k.args, "correlation")) {
    auto it = ev.launch_by_correlation.find(*corr);
    if (it != ev.launch_by_correlation.end()) launch = &it->second;
  }
  if ((!external || !ev.op_by_external.count(*external)) && launch && launch->external) {
    external = launch->external;
  }
  std::size_t op = kNone;
  if (external) {
    if (auto it = ev.op_by_external.find(*external); it != ev.op_by_external.end()) {
      // One operator per External id; should several share it, the innermost one that
      // encloses the launch call.
      for (std::size_t c : it->second) {
        const CpuOp& o = ev.ops[c];
        if (launch && (o.thread != launch->thread || launch->ts < o.ts - kNestSlackUs ||
                       launch->ts > o.end + kNestSlackUs)) {
          continue;
        }
        if (op == kNone || o.end - o.ts < ev.ops[op].end - ev.ops[op].ts) op = c;
      }
      if (op == kNone) op = it->second.front();
    }
  }
  return op;
}

// The call a kernel of operator `op` belongs to: its outermost GEMM or attention ancestor, else
// its innermost memory-bound one; kNone when it has neither.
std::size_t call_of(const std::vector<CpuOp>& ops, std::size_t op) {
  std::size_t compute = kNone, memory = kNone;
  for (std::size_t o = op; o != kNone; o = ops[o].parent) {
    const OpClass c = class_of(ops[o].name);
    if (c == OpClass::gemm || c == OpClass::attention) compute = o;
    if (c == OpClass::memory && memory == kNone) memory = o;
  }
  return compute != kNone ? compute : memory;
}

struct Call {
  std::size_t op;
  double dur = 0;
};
using Calls = std::map<std::size_t, Call>;  // by operator, in trace order

Calls link_kernels(const Reader& in, const Events& ev, TraceCalibration& result) {
  Calls calls;
  std::map<std::string, std::int64_t> other_ops;
  std::int64_t unlinked = 0;
  for (const KernelEvent& k : ev.kernels) {
    const std::size_t op = operator_of(ev, k);
    if (op == kNone) {
      ++unlinked;
      continue;
    }
    const std::size_t chosen = call_of(ev.ops, op);
    if (chosen == kNone) {
      ++other_ops[ev.ops[op].name];
      continue;
    }
    auto [it, fresh] = calls.try_emplace(chosen, Call{chosen});
    it->second.dur += k.dur;
  }
  if (ev.ops.empty() && !ev.kernels.empty()) {
    in.fail(ev.base,
            "GPU kernels but no CPU operators (cat \"cpu_op\"): the trace cannot say "
            "which operator and shapes each kernel ran; record it with "
            "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] and "
            "record_shapes=True");
  }
  if (unlinked > 0) {
    result.skipped["other: kernels not linked to a CPU operator (no matching \"External id\")"] +=
        unlinked;
  }
  if (!other_ops.empty()) {
    std::int64_t n = 0;
    for (const auto& [op_name, count] : other_ops) n += count;
    result.skipped["other: kernels of operators not fitted (" + top_names(other_ops, 4) + ")"] += n;
  }
  return calls;
}

// Shapes: without "Input Dims" on any recognised operator, the trace was recorded without
// record_shapes.
void require_shapes(const Reader& in, const Events& ev, const Calls& calls) {
  std::size_t first_without_shapes = kNone;
  bool any_shapes = false;
  for (const auto& [o, call] : calls) {
    const json* args = ev.ops[o].args;
    if (args && args->contains("Input Dims")) {
      any_shapes = true;
    } else if (first_without_shapes == kNone) {
      first_without_shapes = o;
    }
  }
  if (!any_shapes && first_without_shapes != kNone) {
    in.fail(ev.path_of(ev.ops[first_without_shapes].index) + ".args.Input Dims",
            "no shapes recorded (" + ev.ops[first_without_shapes].name +
                " has no \"Input Dims\"): record the trace with record_shapes=True "
                "(torch.profiler.profile(..., record_shapes=True))");
  }
}

// ---- Each call's figure, summed by kind.

struct GemmKey {
  std::int64_t m, n, k, batch;
  DType dtype;
  auto operator<=>(const GemmKey&) const = default;
};

struct Flow {
  double bytes = 0, seconds = 0;
};

struct Figures {
  std::map<GemmKey, std::vector<Time>> gemm_times;
  std::array<double, std::size(kAllDTypes)> attention_flops{}, attention_seconds{};
  Flow elementwise, dtod, htod, dtoh;
};

// An operator's "Input Dims", "Input type" and "Concrete Inputs", each null when absent.
Inputs inputs_of(const Reader& in, const CpuOp& op, const std::string& apath) {
  Inputs inputs;
  if (op.args) {
    auto field = [&](const char* key) -> const json* {
      auto it = op.args->find(key);
      if (it == op.args->end()) return nullptr;
      if (!it->is_array()) in.fail(apath + "." + key, "expected an array, one entry per input");
      return &*it;
    };
    inputs.dims = field("Input Dims");
    inputs.types = field("Input type");
    inputs.concrete = field("Concrete Inputs");
  }
  return inputs;
}

Fitted fit_call(OpClass c, const std::string& op_name, const Inputs& inputs) {
  if (c == OpClass::gemm) return fit_gemm(gemm_ops().find(op_name)->second, inputs);
  if (c == OpClass::attention) {
    return fit_attention(attention_ops().find(op_name)->second, inputs);
  }
  return fit_memory(memory_ops().find(op_name)->second, inputs);
}

// Adds a fitted call of duration `t` to its figure.
void add_fitted(const Fitted& f, Time t, const TraceCalibrationOptions& options, Figures& fig,
                TraceCalibration& result) {
  if (f.gemm) {
    const auto& g = *f.gemm;
    fig.gemm_times[{g.m, g.n, g.k, g.batch, g.dtype}].push_back(t);
    ++result.gemm_calls;
  } else if (f.attention) {
    const auto d = static_cast<std::size_t>(f.attention->dtype);
    fig.attention_flops[d] += strategies::attention_flops(*f.attention).count();
    fig.attention_seconds[d] += t.seconds();
    ++result.attention_calls;
  } else if (f.bytes->count() < options.min_memory_bytes.count()) {
    ++result.skipped["elementwise: calls moving under " + to_string(options.min_memory_bytes) +
                     " (latency-bound)"];
  } else {
    fig.elementwise.bytes += static_cast<double>(f.bytes->count());
    fig.elementwise.seconds += t.seconds();
    ++result.elementwise_calls;
  }
}

void add_call(const Reader& in, const Events& ev, const CpuOp& op, const Call& call,
              const TraceCalibrationOptions& options, Figures& fig, TraceCalibration& result) {
  const OpClass c = class_of(op.name);
  const char* what = c == OpClass::gemm        ? "gemm"
                     : c == OpClass::attention ? "attention"
                                               : "elementwise";
  const std::string apath = ev.path_of(op.index) + ".args";
  const Inputs inputs = inputs_of(in, op, apath);
  if (!inputs.dims || !inputs.types) {
    ++result.skipped[std::string(what) + ": no shapes recorded (\"Input Dims\", \"Input type\")"];
    return;
  }
  if (inputs.dims->size() != inputs.types->size()) {
    in.fail(apath + ".Input type", "expected one entry per entry of \"Input Dims\" (" +
                                       std::to_string(inputs.dims->size()) + ")");
  }
  if (call.dur > kMaxMicros) {
    ++result.skipped[std::string(what) + ": calls longer than " +
                     std::to_string(static_cast<std::int64_t>(kMaxMicros)) + " us"];
    return;
  }
  const Time t = duration_of(call.dur);
  if (t <= Time::zero()) {
    ++result.skipped[std::string(what) + ": kernels of zero duration"];
    return;
  }
  const Fitted f = fit_call(c, op.name, inputs);
  if (!f.skip.empty()) {
    ++result.skipped[std::string(what) + ": " + f.skip];
    return;
  }
  add_fitted(f, t, options, fig, result);
}

void add_copy(const CopyEvent& c, const TraceCalibrationOptions& options, Figures& fig,
              TraceCalibration& result) {
  const auto bytes = integer_arg(c.args, "bytes");
  if (!bytes || *bytes < 0) {
    ++result.skipped["copies: memcpys without \"bytes\""];
    return;
  }
  const bool pinned = c.name.find("Pinned") != std::string::npos;
  Flow* flow = nullptr;
  double factor = 1;
  if (c.name.find("DtoD") != std::string::npos) {
    flow = &fig.dtod, factor = 2;
  } else if (c.name.find("HtoD") != std::string::npos && pinned) {
    flow = &fig.htod;
  } else if (c.name.find("DtoH") != std::string::npos && pinned) {
    flow = &fig.dtoh;
  } else {
    ++result.skipped["copies: pageable or peer-to-peer memcpys"];
    return;
  }
  if (*bytes < options.min_memory_bytes.count()) {
    ++result.skipped["copies: memcpys under " + to_string(options.min_memory_bytes)];
    return;
  }
  if (duration_of(c.dur) <= Time::zero()) {
    ++result.skipped["copies: memcpys of zero duration"];
    return;
  }
  flow->bytes += factor * static_cast<double>(*bytes);
  flow->seconds += c.dur * 1e-6;
  ++result.copies;
}

// ---- The profile from the figures.

std::string profile_source(const std::string& name, const TraceCalibration& result) {
  return "stratasim calibrate --from-trace " + fs::path(name).filename().string() +
         ": a PyTorch profiler trace" + (result.gpu.empty() ? "" : " recorded on " + result.gpu) +
         ", " + std::to_string(result.kernels) + " GPU kernels and copies";
}

void write_gemms(const Figures& fig, const hw::DeviceSpec& device, TraceCalibration& result) {
  for (const auto& [key, times] : fig.gemm_times) {
    hw::GemmMeasurement g;
    g.m = key.m, g.n = key.n, g.k = key.k, g.batch = key.batch, g.dtype = key.dtype;
    g.time = hw::lower_median(times);
    if (const auto peak = peak_of(device, g.dtype); peak && g.rate() > *peak) {
      result.notes.push_back(
          "GEMM " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) +
          (g.batch > 1 ? " x" + std::to_string(g.batch) : "") + " " +
          std::string(name_of(g.dtype)) + " runs at " + to_string(g.rate()) + ", above " +
          device.name + "'s " + std::string(name_of(g.dtype)) + " peak " + to_string(*peak) +
          (g.dtype == DType::fp32 ? " (TF32 was enabled, or the trace is of another device)"
                                  : " (is the trace of another device?)"));
    }
    result.profile.gemm.push_back(g);
  }
}

void write_attention(const Figures& fig, const hw::DeviceSpec& device, TraceCalibration& result) {
  for (DType t : kAllDTypes) {
    const auto d = static_cast<std::size_t>(t);
    if (fig.attention_seconds[d] <= 0) continue;
    const FlopRate rate(fig.attention_flops[d] / fig.attention_seconds[d]);
    result.profile.attention[d] = rate;
    if (const auto peak = peak_of(device, t); peak && rate > *peak) {
      result.notes.push_back("attention " + std::string(name_of(t)) + " runs at " +
                             to_string(rate) + ", above " + device.name + "'s peak " +
                             to_string(*peak));
    }
  }
}

// bytes / seconds into `field`, with a note when `check` and it exceeds the device's.
void write_bandwidth(const Flow& flow, const char* what, std::optional<Bandwidth>& field,
                     bool check, const hw::DeviceSpec& device, TraceCalibration& result) {
  if (flow.seconds <= 0) return;
  field = Bandwidth(flow.bytes / flow.seconds);
  if (check && *field > device.memory_bandwidth) {
    result.notes.push_back(std::string(what) + " " + to_string(*field) + " is above " +
                           device.name + "'s memory bandwidth " +
                           to_string(device.memory_bandwidth) +
                           " (tensors served from cache, or the trace is of another device?)");
  }
}

void write_launch_overhead(const std::vector<Time>& launch_times, TraceCalibration& result) {
  result.launches = static_cast<std::int64_t>(launch_times.size());
  if (!launch_times.empty()) {
    result.profile.kernel_launch_overhead = hw::lower_median(launch_times);
  } else {
    result.notes.push_back(
        "no launch calls (cuda_runtime cudaLaunchKernel) in the trace: the launch overhead is "
        "not fitted");
  }
}

void write_profile(const std::string& name, const hw::DeviceSpec& device,
                   const TraceCalibrationOptions& options, const Figures& fig,
                   const std::vector<Time>& launch_times, TraceCalibration& result) {
  hw::DeviceProfile& p = result.profile;
  p.device = device.name;
  p.date = options.date;
  p.source = profile_source(name, result);
  write_gemms(fig, device, result);
  write_attention(fig, device, result);
  write_bandwidth(fig.elementwise, "elementwise bandwidth", p.elementwise_bandwidth, true, device,
                  result);
  write_bandwidth(fig.dtod, "memory bandwidth", p.memory_bandwidth, true, device, result);
  write_bandwidth(fig.htod, "host-to-device copies", p.host_to_device_bandwidth, false, device,
                  result);
  write_bandwidth(fig.dtoh, "device-to-host copies", p.device_to_host_bandwidth, false, device,
                  result);
  write_launch_overhead(launch_times, result);
}

// The profile must hold at least one figure, and be valid.
void check_profile(const Reader& in, const std::string& base, const TraceCalibration& result) {
  const hw::DeviceProfile& p = result.profile;
  if (p.gemm.empty() && !p.elementwise_bandwidth && !p.memory_bandwidth &&
      !p.host_to_device_bandwidth && !p.device_to_host_bandwidth &&
      std::none_of(p.attention.begin(), p.attention.end(),
                   [](const auto& a) { return a.has_value(); })) {
    std::string why;
    for (const auto& [reason, n] : result.skipped) {
      why += "; " + std::to_string(n) + " " + reason;
    }
    in.fail(base,
            "nothing to calibrate from: no GEMM, attention, memory-bound operator or copy "
            "with usable shapes" +
                why);
  }
  try {
    p.validate();
  } catch (const config::ValidationError& e) {
    in.fail(base, "the fitted profile is invalid at " + e.path() + ": " + e.what());
  }
}

}  // namespace

TraceCalibration calibrate_from_kineto_text(const std::string& name, const std::string& text,
                                            const hw::DeviceSpec& device,
                                            const TraceCalibrationOptions& options) {
  const Reader in{name};
  const json doc = parse_document(in, text);
  std::string base;
  const json& events = trace_events(in, doc, base);
  TraceCalibration result;
  result.gpu = gpu_name(doc);
  Events ev = read_events(in, events, base, result);
  nest_operators(ev.ops);
  const Calls calls = link_kernels(in, ev, result);
  require_shapes(in, ev, calls);
  Figures fig;
  for (const auto& [o, call] : calls) add_call(in, ev, ev.ops[o], call, options, fig, result);
  for (const CopyEvent& c : ev.copies) add_copy(c, options, fig, result);
  write_profile(name, device, options, fig, ev.launch_times, result);
  check_profile(in, base, result);
  return result;
}

TraceCalibration calibrate_from_kineto(const fs::path& file, const hw::DeviceSpec& device,
                                       const TraceCalibrationOptions& options) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    throw TraceError(file.string(), "", "no such file (a PyTorch profiler trace, .json)");
  }
  if (file.string().ends_with(".gz")) {
    throw TraceError(file.string(), "", "compressed traces are not read: gunzip it first");
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) throw TraceError(file.string(), "", "cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  return calibrate_from_kineto_text(file.string(), s.str(), device, options);
}

}  // namespace stratasim::traces
