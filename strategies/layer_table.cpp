#include "strategies/layer_table.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

namespace stratasim::strategies {

namespace {

constexpr int kMaxLayers = std::numeric_limits<std::int16_t>::max();  // Op::layer_end is int16

std::string layer_path(std::size_t i) {
  return "layers[" + std::to_string(i) + "]";
}

// ceil(v * num / den) for v >= 0, without overflow for any v that fits.
std::int64_t scale_up(std::int64_t v, std::int64_t num, std::int64_t den) {
  if (num == den) return v;
  const std::int64_t q = v / den, r = v % den;
  return q * num + (r * num + den - 1) / den;
}

// ---- Reading.

bool present(config::ObjectReader& r, std::string_view key) {
  if (!r.has(key)) return false;
  const nlohmann::json* v = r.document().find(r.path_of(key));
  return v != nullptr && !v->is_null();
}

std::optional<Flops> optional_flops(config::ObjectReader& r, std::string_view key) {
  if (!present(r, key)) return std::nullopt;
  const nlohmann::json& v = *r.document().find(r.path_of(key));
  if (v.is_number()) {
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < 0) {
      r.fail(key, "expected a non-negative amount of work, got " + v.dump());
    }
    return Flops(x);
  }
  if (!v.is_string()) {
    r.fail(key, "expected an amount of work with its unit as a string, such as \"3.1 GFLOP\"");
  }
  try {
    return parse_flops(v.get<std::string>());
  } catch (const UnitError& e) {
    r.fail(key, e.what());
  }
}

std::optional<Time> optional_time(config::ObjectReader& r, std::string_view key) {
  if (!present(r, key)) return std::nullopt;
  return r.time(key);
}

TableLayer read_layer(config::ObjectReader& r) {
  TableLayer l;
  l.name = r.string("name");
  l.repeat = static_cast<int>(r.integer_in_or("repeat", 1, kMaxLayers, 1));
  l.params = r.integer_in_or("params", 0, std::int64_t{1} << 50, 0);
  l.activation_bytes = r.bytes_or("activation_bytes", Bytes());
  l.output_bytes = r.bytes_or("output_bytes", Bytes());
  l.weight_grad_bytes = r.bytes_or("weight_grad_bytes", Bytes());
  l.forward_bytes = r.bytes_or("forward_bytes", Bytes());
  l.forward_flops = optional_flops(r, "forward_flops");
  l.backward_input_flops = optional_flops(r, "backward_input_flops");
  l.backward_weight_flops = optional_flops(r, "backward_weight_flops");
  l.forward_time = optional_time(r, "forward_time");
  l.backward_input_time = optional_time(r, "backward_input_time");
  l.backward_weight_time = optional_time(r, "backward_weight_time");
  // Defaults within the family the layer uses: input gradient as costly as the forward, weight
  // gradient too when there are weights. A missing forward figure is left for validate().
  if (l.forward_flops && !l.uses_times()) {
    if (!l.backward_input_flops) l.backward_input_flops = l.forward_flops;
    if (!l.backward_weight_flops) {
      l.backward_weight_flops = l.params > 0 ? *l.forward_flops : Flops();
    }
  }
  if (l.forward_time && !l.uses_flops()) {
    if (!l.backward_input_time) l.backward_input_time = l.forward_time;
    if (!l.backward_weight_time) {
      l.backward_weight_time = l.params > 0 ? *l.forward_time : Time::zero();
    }
  }
  r.finish();
  return l;
}

// ---- Planning.

Kernel layer_kernel(const TableLayer& l, const std::optional<Flops>& flops,
                    const std::optional<Time>& time, Bytes bytes, const std::string& suffix,
                    const LayerTableSetting& setting, std::int64_t batch) {
  const std::int64_t mb = setting.micro_batch;
  if (flops) {
    return Kernel{RooflineWork{scale_to_micro_batch(*flops, mb, batch),
                               scale_to_micro_batch(bytes, mb, batch), setting.dtype},
                  l.name + suffix};
  }
  return Kernel{Measured{scale_to_micro_batch(time.value_or(Time::zero()), mb, batch)},
                l.name + suffix};
}

bool has_work(const Kernel& k) {
  if (const auto* r = std::get_if<RooflineWork>(&k.work)) {
    return r->flops.count() > 0 || r->bytes.count() > 0;
  }
  if (const auto* m = std::get_if<Measured>(&k.work)) return m->duration > Time::zero();
  return true;
}

Segment layer_segment(const TableLayer& l, int index, std::vector<Kernel> kernels) {
  Segment s;
  s.compute = true;
  s.label = l.name;
  s.layer_begin = index;
  s.layer_end = index + 1;
  // Kernels with no work would only add launch overheads; a segment without any work keeps
  // its first kernel so that it still is an op.
  std::vector<Kernel> kept;
  for (auto& k : kernels) {
    if (has_work(k)) kept.push_back(std::move(k));
  }
  if (kept.empty()) kept.push_back(std::move(kernels.front()));
  s.kernels = std::move(kept);
  return s;
}

}  // namespace

// ---- Scaling.

Bytes scale_to_micro_batch(Bytes b, std::int64_t micro_batch, std::int64_t batch) {
  if (b.count() < 0) return -scale_to_micro_batch(-b, micro_batch, batch);
  return Bytes(scale_up(b.count(), micro_batch, batch));
}

Time scale_to_micro_batch(Time t, std::int64_t micro_batch, std::int64_t batch) {
  return Time::ps(scale_up(t.picoseconds(), micro_batch, batch));
}

Flops scale_to_micro_batch(Flops f, std::int64_t micro_batch, std::int64_t batch) {
  if (micro_batch == batch) return f;
  return Flops(f.count() * static_cast<double>(micro_batch) / static_cast<double>(batch));
}

// ---- The model.

std::vector<TableLayer> LayerTableModel::expanded() const {
  std::vector<TableLayer> out;
  out.reserve(static_cast<std::size_t>(std::max(0, layer_count())));
  for (const auto& l : layers) {
    for (int k = 0; k < l.repeat; ++k) {
      TableLayer e = l;
      e.repeat = 1;
      if (l.repeat > 1) e.name = l.name + "." + std::to_string(k);
      out.push_back(std::move(e));
    }
  }
  return out;
}

int LayerTableModel::layer_count() const {
  std::int64_t n = 0;
  for (const auto& l : layers) n += std::max(0, l.repeat);
  return static_cast<int>(std::min<std::int64_t>(n, std::numeric_limits<int>::max()));
}

std::int64_t LayerTableModel::parameters() const {
  std::int64_t n = 0;
  for (const auto& l : layers) n += l.params * l.repeat;
  return n;
}

void LayerTableModel::validate() const {
  using config::ValidationError;
  if (batch < 1) throw ValidationError("batch", "expected at least 1 sample per micro-batch");
  if (layers.empty()) throw ValidationError("layers", "expected at least one layer");
  std::int64_t count = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const TableLayer& l = layers[i];
    const std::string at = layer_path(i);
    const auto key = [&](std::string_view k) { return config::join_path(at, k); };
    if (l.name.empty()) throw ValidationError(key("name"), "expected a non-empty layer name");
    if (l.repeat < 1) {
      throw ValidationError(key("repeat"), "expected at least 1, got " + std::to_string(l.repeat));
    }
    count += l.repeat;
    if (count > kMaxLayers) {
      throw ValidationError(key("repeat"), "the model expands to more than " +
                                               std::to_string(kMaxLayers) + " layers");
    }
    if (l.params < 0) {
      throw ValidationError(key("params"), "expected a non-negative parameter count, got " +
                                               std::to_string(l.params));
    }
    const std::pair<const char*, Bytes> sizes[] = {{"activation_bytes", l.activation_bytes},
                                                   {"output_bytes", l.output_bytes},
                                                   {"weight_grad_bytes", l.weight_grad_bytes},
                                                   {"forward_bytes", l.forward_bytes}};
    for (const auto& [k, b] : sizes) {
      if (b.count() < 0) {
        throw ValidationError(key(k), "expected a non-negative size, got " + to_string(b));
      }
    }
    if (l.weight_grad_bytes > l.activation_bytes) {
      throw ValidationError(key("weight_grad_bytes"),
                            "must be part of activation_bytes (" + to_string(l.activation_bytes) +
                                "), got " + to_string(l.weight_grad_bytes));
    }
    if (l.uses_flops() && l.uses_times()) {
      const char* k = l.forward_time          ? "forward_time"
                      : l.backward_input_time ? "backward_input_time"
                                              : "backward_weight_time";
      throw ValidationError(key(k),
                            "a layer gives either FLOPs (forward_flops, backward_input_flops, "
                            "backward_weight_flops) or measured times (forward_time, "
                            "backward_input_time, backward_weight_time), not both");
    }
    if (!l.uses_flops() && !l.uses_times()) {
      throw ValidationError(key("forward_flops"),
                            "missing; a layer gives either FLOPs (forward_flops, ...) or measured "
                            "times (forward_time, ...)");
    }
    if (l.uses_flops()) {
      const std::pair<const char*, const std::optional<Flops>*> family[] = {
          {"forward_flops", &l.forward_flops},
          {"backward_input_flops", &l.backward_input_flops},
          {"backward_weight_flops", &l.backward_weight_flops}};
      for (const auto& [k, f] : family) {
        if (!*f) throw ValidationError(key(k), "missing (the layer gives FLOPs)");
        if (!std::isfinite((*f)->count()) || (*f)->count() < 0) {
          throw ValidationError(key(k), "expected a non-negative amount of work, got " +
                                            std::to_string((*f)->count()));
        }
      }
    } else {
      const std::pair<const char*, const std::optional<Time>*> family[] = {
          {"forward_time", &l.forward_time},
          {"backward_input_time", &l.backward_input_time},
          {"backward_weight_time", &l.backward_weight_time}};
      for (const auto& [k, t] : family) {
        if (!*t) throw ValidationError(key(k), "missing (the layer gives measured times)");
        if (**t < Time::zero()) {
          throw ValidationError(key(k), "expected a non-negative duration");
        }
      }
    }
  }
}

LayerTableModel read_layer_table(const config::Document& doc, const std::string& path) {
  config::ObjectReader r(doc, path, "a layer-table model");
  LayerTableModel m;
  r.choice("type", {"layers"});
  m.name = r.string("name");
  m.source = r.string_or("source", "");
  m.batch = r.integer_in_or("batch", 1, std::int64_t{1} << 40, 1);
  if (!present(r, "layers")) r.fail("layers", "missing required key 'layers'");
  const nlohmann::json& list = *doc.find(r.path_of("layers"));
  if (!list.is_array() || list.empty()) {
    r.fail("layers", "expected a non-empty array of layers");
  }
  m.layers.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    // Dotted paths cannot index arrays, so each layer is read from a document of its own whose
    // key is "layers[i]"; its errors are raised again at the layer's path in `doc`, which names
    // the file it came from.
    const std::string key = layer_path(i);
    auto single = config::Document::from_json(nlohmann::json::object({{key, list[i]}}), "layer");
    try {
      config::ObjectReader lr(single, key, "a layer");
      m.layers.push_back(read_layer(lr));
    } catch (const config::ConfigError& e) {
      doc.fail(config::join_path(path, e.path()), e.message());
    }
  }
  r.finish();
  doc.validated(path, [&] { m.validate(); });
  return m;
}

// ---- Planning.

StagePlan plan_layer_table_stage(const LayerTableModel& model, const LayerTableSetting& setting,
                                 int layer_begin, int layer_end) {
  if (layer_begin < 0 || layer_end <= layer_begin || layer_end > model.layer_count()) {
    throw std::invalid_argument("layer range [" + std::to_string(layer_begin) + ", " +
                                std::to_string(layer_end) + ") is not within the " +
                                std::to_string(model.layer_count()) + " layers of " + model.name);
  }
  if (setting.micro_batch < 1) throw std::invalid_argument("micro_batch must be at least 1");
  const std::vector<TableLayer> layers = model.expanded();
  const std::int64_t mb = setting.micro_batch, batch = model.batch;
  StagePlan plan;
  for (int i = layer_end - 1; i >= layer_begin; --i) {
    const TableLayer& l = layers[static_cast<std::size_t>(i)];
    plan.grad_units.push_back({"L" + std::to_string(i), l.params, i});
    plan.parameters += l.params;
  }
  for (int i = layer_begin; i < layer_end; ++i) {
    const TableLayer& l = layers[static_cast<std::size_t>(i)];
    const Bytes stored = scale_to_micro_batch(l.activation_bytes, mb, batch);
    Segment f = layer_segment(l, i,
                              {layer_kernel(l, l.forward_flops, l.forward_time, l.forward_bytes,
                                            ".fwd", setting, batch)});
    f.activation_delta = stored;
    plan.forward.push_back(std::move(f));
  }
  for (int i = layer_end - 1; i >= layer_begin; --i) {
    const TableLayer& l = layers[static_cast<std::size_t>(i)];
    const Bytes stored = scale_to_micro_batch(l.activation_bytes, mb, batch);
    const Bytes wgrad_bytes = l.params > 0 ? l.forward_bytes : Bytes();
    Segment b = layer_segment(l, i,
                              {layer_kernel(l, l.backward_input_flops, l.backward_input_time,
                                            l.forward_bytes, ".dgrad", setting, batch),
                               layer_kernel(l, l.backward_weight_flops, l.backward_weight_time,
                                            wgrad_bytes, ".wgrad", setting, batch)});
    b.activation_delta = -stored;
    b.grads_done.push_back(layer_end - 1 - i);
    plan.backward.push_back(std::move(b));
  }
  plan.boundary_bytes =
      scale_to_micro_batch(layers[static_cast<std::size_t>(layer_end - 1)].output_bytes, mb, batch);
  return plan;
}

Bytes weight_grad_bytes(const LayerTableModel& model, const LayerTableSetting& setting, int layer) {
  if (layer < 0 || layer >= model.layer_count()) {
    throw std::invalid_argument("layer " + std::to_string(layer) + " is not within the " +
                                std::to_string(model.layer_count()) + " layers of " + model.name);
  }
  int index = layer;
  for (const auto& l : model.layers) {
    if (index < l.repeat) {
      return scale_to_micro_batch(l.weight_grad_bytes, setting.micro_batch, model.batch);
    }
    index -= l.repeat;
  }
  return Bytes();  // unreachable: the index was checked
}

}  // namespace stratasim::strategies
