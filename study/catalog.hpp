// Where configs come from: a path, or a name from the shipped catalog (configs/), and overrides
// written as `--set dotted.key=value`. Every entry point (CLI, sweep, benches, Python module)
// finds experiments, clusters and models the same way.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "strategies/experiment.hpp"

namespace stratasim::study {

/// The shipped configs: STRATASIM_CONFIG_DIR in the environment, else the source tree's
/// configs/ as the build recorded it.
std::filesystem::path config_dir();

/// An experiment given by path, or by name from configs/experiments ("gpt3-175b-a100-1024").
/// A name that is neither comes back as given (loading then reports "no such file" with it).
std::filesystem::path resolve_experiment(const std::string& given);
/// A cluster given by path, or by name from configs/hardware/clusters.
std::filesystem::path resolve_cluster(const std::string& given);
/// A device given by path, or by name from configs/hardware/devices ("h100-sxm5-80gb").
std::filesystem::path resolve_device(const std::string& given);
/// A model given by path, or by name from configs/models or configs/models/hf: a name is its
/// file's, and "hf/NAME" names configs/models/hf/NAME.json where configs/models has a NAME too
/// (as `stratasim list models` shows them).
std::filesystem::path resolve_model(const std::string& given);
/// The published calibration set shipped with the sources (tests/reference/calibration.json, a
/// copy of ../shared/reference/calibration.json): beside config_dir().
std::filesystem::path default_calibration_file();
/// A device file, or a name from configs/hardware/devices, read and validated (hw::read_device).
/// Throws config::ConfigError naming the file and JSON path.
hw::DeviceSpec load_device(const std::string& given);

/// "dotted.key=value" as an override of the experiment document: the value parses as JSON
/// when it can (4, true, [1,2]) and as a string otherwise ("400 Gb/s"); a catalog name given
/// to cluster, model or cluster.device ("cluster=dgx-h100-128") becomes the shipped file. `origin`
/// is how errors name it; empty: "--set TEXT". Throws BadInput when there is no key or no '='.
strategies::Override parse_set(std::string_view text, std::string origin = {});

/// An experiment file, or a name from configs/experiments, loaded with `overrides` applied
/// (strategies::load_experiment). Throws config::ConfigError naming the file and JSON path.
strategies::Experiment load(const std::string& given,
                            const std::vector<strategies::Override>& overrides = {});

/// An experiment written as JSON in memory (the Python module's dicts), read as a file would
/// be: "model" and "cluster" (and the cluster's "device") may be objects, files, or names from
/// the catalog; relative files are looked up under configs/experiments as the shipped
/// experiments' are. `source` names the document in errors ("<dict>").
strategies::Experiment from_json(nlohmann::json document,
                                 const std::vector<strategies::Override>& overrides = {},
                                 const std::string& source = "<dict>");

/// `cluster.nodes` and `cluster.devices_per_node` that give `gpus` devices from a cluster of
/// nodes x devices_per_node: whole nodes when gpus is a multiple of devices_per_node, else
/// one node of `gpus` devices (a part of a node). Throws std::invalid_argument when neither
/// is possible (gpus above a node's devices and no multiple of them).
std::vector<strategies::Override> resize_overrides(const hw::ClusterSpec& cluster, int gpus);

}  // namespace stratasim::study
