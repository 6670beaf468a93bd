#include "study/catalog.hpp"

#include <cstdlib>
#include <stdexcept>

#include "hw_models/config_reader.hpp"
#include "study/errors.hpp"

namespace stratasim::study {

namespace fs = std::filesystem;

fs::path config_dir() {
  if (const char* env = std::getenv("STRATASIM_CONFIG_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  return STRATASIM_CONFIG_DIR;
}

namespace {

// `given` if it exists, else the first of `folders` (under config_dir()) holding given.json,
// else `given` unchanged. A name may have a folder of the catalog before it ("hf/llama2-7b" is
// configs/models/hf/llama2-7b.json).
fs::path resolve(const std::string& given, std::initializer_list<const char*> folders) {
  fs::path path(given);
  std::error_code ec;
  if (fs::exists(path, ec)) return path;
  if (!path.is_absolute() && !given.empty() && given.find("..") == std::string::npos) {
    for (const char* folder : folders) {
      fs::path catalog = config_dir() / folder / (given + ".json");
      if (fs::exists(catalog, ec)) return catalog;
    }
  }
  return path;
}

}  // namespace

fs::path resolve_experiment(const std::string& given) {
  return resolve(given, {"experiments"});
}

fs::path resolve_cluster(const std::string& given) {
  return resolve(given, {"hardware/clusters"});
}

fs::path resolve_device(const std::string& given) {
  return resolve(given, {"hardware/devices"});
}

fs::path resolve_model(const std::string& given) {
  return resolve(given, {"models", "models/hf"});
}

fs::path default_calibration_file() {
  return (config_dir() / ".." / "tests" / "reference" / "calibration.json").lexically_normal();
}

hw::DeviceSpec load_device(const std::string& given) {
  auto doc = config::Document::load(resolve_device(given));
  return hw::read_device(doc, "");
}

strategies::Override parse_set(std::string_view text, std::string origin) {
  const auto eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    throw BadInput("--set expects dotted.key=value, got \"" + std::string(text) + "\"");
  }
  if (origin.empty()) origin = "command line (--set " + std::string(text) + ")";
  std::string key(text.substr(0, eq));
  nlohmann::json value = config::parse_override_value(std::string(text.substr(eq + 1)));
  // A shipped config by its catalog name ("--set cluster=dgx-h100-128"), as --cluster takes
  // it: the catalog's file, absolute (a path is left as given).
  if (value.is_string() && (key == "cluster" || key == "model" || key == "cluster.device")) {
    const std::string given = value.get<std::string>();
    const fs::path found = key == "cluster" ? resolve_cluster(given)
                           : key == "model" ? resolve_model(given)
                                            : resolve_device(given);
    std::error_code ec;
    if (found != fs::path(given)) value = fs::absolute(found, ec).string();
  }
  return {std::move(key), std::move(value), std::move(origin)};
}

strategies::Experiment load(const std::string& given,
                            const std::vector<strategies::Override>& overrides) {
  return strategies::load_experiment(resolve_experiment(given), overrides);
}

strategies::Experiment from_json(nlohmann::json document,
                                 const std::vector<strategies::Override>& overrides,
                                 const std::string& source) {
  if (!document.is_object()) {
    config::Document::from_json(nlohmann::json::object(), source)
        .fail("", "expected an experiment object with model, cluster, parallelism and training");
  }
  // A file or catalog name becomes an absolute path, so that the document reads it wherever
  // the process runs; a relative file is taken from configs/experiments, as shipped ones are.
  auto absolute = [](const fs::path& found, const std::string& given) {
    std::error_code ec;
    if (fs::exists(found, ec)) return fs::absolute(found, ec).string();
    const fs::path shipped = config_dir() / "experiments" / given;
    if (fs::exists(shipped, ec)) return shipped.lexically_normal().string();
    return given;
  };
  if (auto it = document.find("model"); it != document.end() && it->is_string()) {
    const std::string given = it->get<std::string>();
    *it = absolute(resolve_model(given), given);
  }
  if (auto it = document.find("cluster"); it != document.end() && it->is_string()) {
    const std::string given = it->get<std::string>();
    *it = absolute(resolve_cluster(given), given);
  }
  auto doc = config::Document::from_json(std::move(document), source);
  return strategies::read_experiment(doc, overrides);
}

std::vector<strategies::Override> resize_overrides(const hw::ClusterSpec& cluster, int gpus) {
  const int per_node = cluster.devices_per_node;
  int nodes = 0, devices = 0;
  if (gpus > 0 && gpus % per_node == 0) {
    nodes = gpus / per_node;
    devices = per_node;
  } else if (gpus > 0 && gpus < per_node) {
    nodes = 1;
    devices = gpus;
  } else {
    throw std::invalid_argument(std::to_string(gpus) + " GPUs are neither whole nodes of " +
                                std::to_string(per_node) + " devices nor part of one node");
  }
  const std::string origin = "search (" + std::to_string(gpus) + " GPUs)";
  return {{"cluster.nodes", nodes, origin}, {"cluster.devices_per_node", devices, origin}};
}

}  // namespace stratasim::study
