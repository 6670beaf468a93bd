// Launchers on a pasted command line (strategies/launch_line.hpp has what each option means).
#include "strategies/launch_line.hpp"

#include <algorithm>
#include <charconv>
#include <string_view>

#include "hw_models/config_reader.hpp"

namespace stratasim::strategies {

namespace {

constexpr std::int64_t kMaxSize = std::int64_t{1} << 24;

enum class Launcher { none, torchrun, deepspeed, srun, mpirun };

std::string basename_of(const std::string& word) {
  const auto slash = word.rfind('/');
  return slash == std::string::npos ? word : word.substr(slash + 1);
}

bool is_python(const std::string& word) {
  const std::string name = basename_of(word);
  return name.rfind("python", 0) == 0 &&
         name.find_first_not_of("0123456789.", 6) == std::string::npos;
}

Launcher launcher_of(const std::string& word) {
  const std::string name = basename_of(word);
  if (name == "torchrun") return Launcher::torchrun;
  if (name == "deepspeed") return Launcher::deepspeed;
  if (name == "srun") return Launcher::srun;
  if (name == "mpirun" || name == "mpiexec" || name == "mpiexec.hydra" || name == "orterun") {
    return Launcher::mpirun;
  }
  return Launcher::none;
}

bool ends_with(const std::string& word, std::string_view tail) {
  return word.size() >= tail.size() &&
         word.compare(word.size() - tail.size(), tail.size(), tail.data(), tail.size()) == 0;
}

// A word that starts a program: a launcher, a Python interpreter or a script.
bool is_program(const std::string& word) {
  return launcher_of(word) != Launcher::none || is_python(word) || ends_with(word, ".py") ||
         ends_with(word, ".sh");
}

// An option, not a value: "-x", "--name"; "-1" (deepspeed's --num_gpus -1) is a value.
bool is_option(const std::string& word) {
  return word.size() >= 2 && word[0] == '-' &&
         word.find_first_not_of("0123456789", 1) != std::string::npos;
}

bool is_assignment(const std::string& word) {
  const auto eq = word.find('=');
  if (eq == std::string::npos || eq == 0 || word[0] == '-') return false;
  return std::all_of(word.begin(), word.begin() + static_cast<long>(eq), [](char c) {
    return c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
  });
}

// One option as written: its name, its value (after '=' or the next word) and how it read.
struct Option {
  std::string name;
  std::string value;
  bool has_value = false;
  std::string given;  // "--nnodes 2"
};

// Options that take no value (the next word is not theirs).
bool is_flag(Launcher l, const std::string& name) {
  static const std::vector<std::string> torchrun = {"--standalone", "--no_python", "--no-python",
                                                    "--module",     "--run_path",  "--run-path",
                                                    "--use_env",    "--use-env"};
  static const std::vector<std::string> deepspeed = {
      "--no_python", "--no_local_rank",        "--no_ssh_check",     "--force_multi",
      "--save_pid",  "--enable_each_rank_log", "--elastic_training", "--module",
      "--no_ssh",    "--bind_cores_to_rank",   "--force_multi"};
  static const std::vector<std::string> srun = {"--exclusive",  "--pty", "--overlap",
                                                "--unbuffered", "-u",    "-l",
                                                "--label",      "-v",    "--verbose"};
  static const std::vector<std::string> mpirun = {
      "--allow-run-as-root", "--oversubscribe", "--tag-output", "--report-bindings", "-v",
      "--verbose",           "--noprefix"};
  const auto& list = l == Launcher::torchrun    ? torchrun
                     : l == Launcher::deepspeed ? deepspeed
                     : l == Launcher::srun      ? srun
                                                : mpirun;
  return std::find(list.begin(), list.end(), name) != list.end();
}

class LaunchReader {
 public:
  LaunchReader(const std::vector<std::string>& words, std::string source)
      : words_(words), source_(std::move(source)) {}

  LaunchLine read() {
    // The first launcher, before the script: words before it (VAR=value, "uv run", "nsys
    // profile -o out") are a prefix.
    std::size_t first = 0;
    while (first < words_.size() && !starts_launch(first) && !ends_with(words_[first], ".py")) {
      ++first;
    }
    if (first == words_.size() || !starts_launch(first)) {
      LaunchLine all;  // no launcher: all arguments
      all.args = words_;
      return all;
    }
    for (std::size_t k = 0; k < first; ++k) {
      if (!is_assignment(words_[k])) out_.prefix.push_back(words_[k]);
    }
    i_ = first;
    while (i_ < words_.size()) {
      const std::string& word = words_[i_];
      const Launcher l = launcher_of(word);
      if (l != Launcher::none) {
        out_.launchers.push_back(word);
        ++i_;
        options(l);
        continue;
      }
      if (is_python(word)) {
        if (python()) continue;  // python -m torch.distributed.run: its options follow
        break;
      }
      out_.script.push_back(word);  // the script itself
      ++i_;
      break;
    }
    if (!out_.launchers.empty()) apply_torchrun_defaults();
    out_.args.assign(words_.begin() + static_cast<long>(i_), words_.end());
    return std::move(out_);
  }

 private:
  // Whether words_[at] starts a launch: a launcher, or python -m torch.distributed.run/launch.
  bool starts_launch(std::size_t at) const {
    if (launcher_of(words_[at]) != Launcher::none) return true;
    if (!is_python(words_[at])) return false;
    for (std::size_t k = at + 1; k + 1 < words_.size() && words_[k].rfind('-', 0) == 0; ++k) {
      if (words_[k] == "-m") return is_torch_launcher(words_[k + 1]);
    }
    return false;
  }
  static bool is_torch_launcher(const std::string& module) {
    return module == "torch.distributed.run" || module == "torch.distributed.launch";
  }

  // python [-u ...] -m torch.distributed.run: reads its options and returns true; python
  // [-u ...] script.py (or -m module): the script, returns false.
  bool python() {
    out_.script.push_back(words_[i_++]);
    while (i_ < words_.size() && words_[i_].rfind('-', 0) == 0) {
      const std::string& flag = words_[i_];
      if (flag == "-m" && i_ + 1 < words_.size()) {
        if (is_torch_launcher(words_[i_ + 1])) {
          out_.script.clear();
          out_.launchers.push_back("python -m " + words_[i_ + 1]);
          i_ += 2;
          options(Launcher::torchrun);
          return true;
        }
        out_.script.push_back(words_[i_++]);
        out_.script.push_back(words_[i_++]);  // the module is the script
        return false;
      }
      const bool valued = flag == "-W" || flag == "-X" || flag == "-c";
      out_.script.push_back(words_[i_++]);
      if (valued && i_ < words_.size()) out_.script.push_back(words_[i_++]);
    }
    if (i_ < words_.size()) out_.script.push_back(words_[i_++]);
    return false;
  }

  // The options of launcher `l`, up to the program it starts.
  void options(Launcher l) {
    while (i_ < words_.size()) {
      const std::string& word = words_[i_];
      if (word == "--") {  // the end of the launcher's options
        ++i_;
        return;
      }
      if (word.size() < 2 || word[0] != '-') {
        if (is_program(word)) return;
        ++i_;  // the value of an option not known here
        continue;
      }
      Option o;
      const auto eq = word.find('=');
      o.name = word.substr(0, eq);
      if (eq != std::string::npos) {
        o.value = word.substr(eq + 1);
        o.has_value = true;
      }
      ++i_;
      // Slurm's and Open MPI's joined short forms: -N2, -n16.
      if (!o.has_value && o.name.size() > 2 && o.name[1] != '-' &&
          (l == Launcher::srun || l == Launcher::mpirun) &&
          (o.name[1] == 'N' || o.name[1] == 'n') &&
          o.name.find_first_not_of("0123456789", 2) == std::string::npos) {
        o.value = o.name.substr(2);
        o.name = o.name.substr(0, 2);
        o.has_value = true;
      }
      if (!o.has_value && i_ < words_.size() && !is_option(words_[i_]) && !is_program(words_[i_]) &&
          !is_flag(l, o.name)) {
        o.value = words_[i_++];
        o.has_value = true;
      }
      o.given = o.name + (o.has_value ? " " + o.value : "");
      sized(l, o);
    }
  }

  // Records the sizes an option gives (nodes, per node, world), by launcher.
  void sized(Launcher l, const Option& o);

  // torchrun's defaults (--nnodes 1, --nproc_per_node 1) once it was given a size.
  void apply_torchrun_defaults() {
    if (!torchrun_sized_) return;
    if (!out_.nodes) out_.nodes = LaunchSize{1, "torchrun's default --nnodes 1"};
    if (!out_.per_node && !torchrun_per_node_given_) {
      out_.per_node = LaunchSize{1, "torchrun's default --nproc_per_node 1"};
    }
  }

  LaunchSize size(const Option& o, const std::string& text, const char* what) const {
    std::int64_t v = 0;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, v);
    if (text.empty() || ec != std::errc() || ptr != end || v < 1 || v > kMaxSize) {
      fail(o,
           std::string("expected a number of ") + what + " from 1 to " + std::to_string(kMaxSize) +
               ", got \"" + text + "\"" +
               (text.find('$') != std::string::npos ? " (a shell variable: give its value)" : ""));
    }
    return {v, o.given};
  }

  [[noreturn]] void fail(const Option& o, const std::string& message) const {
    throw config::ConfigError(source_, o.name, message);
  }

  const std::vector<std::string>& words_;
  std::string source_;
  std::size_t i_ = 0;
  LaunchLine out_;
  bool torchrun_sized_ = false;
  bool torchrun_per_node_given_ = false;
};

void LaunchReader::sized(Launcher l, const Option& o) {
  const auto is = [&](std::initializer_list<const char*> names) {
    return std::any_of(names.begin(), names.end(), [&](const char* n) { return o.name == n; });
  };
  switch (l) {
    case Launcher::torchrun:
      if (is({"--nnodes"})) {
        std::string v = o.value;
        // "2:2" is one size; "1:4" (elastic) is not.
        if (const auto colon = v.find(':'); colon != std::string::npos) {
          if (v.substr(0, colon) != v.substr(colon + 1)) {
            fail(o, "is an elastic range of nodes, not one size: give the number of nodes");
          }
          v = v.substr(0, colon);
        }
        out_.nodes = size(o, v, "nodes");
        torchrun_sized_ = true;
      } else if (is({"--nproc_per_node", "--nproc-per-node"})) {
        torchrun_sized_ = true;
        torchrun_per_node_given_ = true;
        if (o.value == "gpu" || o.value == "auto") return;  // every GPU: the cluster's
        out_.per_node = size(o, o.value, "processes per node");
      }
      return;
    case Launcher::deepspeed:
      if (is({"--num_nodes", "--num-nodes"}) && o.value != "-1") {
        out_.nodes = size(o, o.value, "nodes");
      } else if (is({"--num_gpus", "--num-gpus"}) && o.value != "-1") {
        out_.per_node = size(o, o.value, "GPUs per node");
      }
      return;
    case Launcher::srun:
      if (is({"-N", "--nodes"})) {
        out_.nodes = size(o, o.value, "nodes");
      } else if (is({"--ntasks-per-node"})) {
        out_.per_node = size(o, o.value, "tasks per node");
      } else if (is({"--gpus-per-node"})) {  // "8" or "h100:8"
        const auto colon = o.value.rfind(':');
        out_.per_node = size(o, colon == std::string::npos ? o.value : o.value.substr(colon + 1),
                             "GPUs per node");
      } else if (is({"-n", "--ntasks"})) {
        out_.world = size(o, o.value, "tasks");
      }
      return;
    case Launcher::mpirun:
      if (is({"-np", "-n", "--np", "-c"})) {
        out_.world = size(o, o.value, "processes");
      } else if (is({"-npernode", "--npernode", "-N", "-ppn", "--ppn", "-perhost"})) {
        out_.per_node = size(o, o.value, "processes per node");
      } else if (is({"--map-by", "-map-by"}) && o.value.rfind("ppr:", 0) == 0) {
        // ppr:G:node[:options]
        const std::string rest = o.value.substr(4);
        const auto colon = rest.find(':');
        if (colon != std::string::npos && rest.compare(colon + 1, 4, "node") == 0) {
          out_.per_node = size(o, rest.substr(0, colon), "processes per node");
        }
      }
      return;
    case Launcher::none:
      return;
  }
}

}  // namespace

LaunchLine read_launch_line(const std::vector<std::string>& words, const std::string& source) {
  return LaunchReader(words, source).read();
}

}  // namespace stratasim::strategies
