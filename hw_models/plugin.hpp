// Where stratasim's optional back ends are found and how they are loaded. The libraries that
// reach real hardware — the CUDA device (libstratasim_cuda.so: CUDA, cuBLASLt, NCCL; exec/) and
// MPI (libstratasim_mpi.so for sweeps across processes; search/) — are plugins: shared libraries
// loaded with dlopen by the command that needs them, so that every other command (a simulation,
// --version) starts without mapping them.
//
// One rule for every plugin: the first of these directories that holds the file is used
//   1. $STRATASIM_PLUGIN_DIR, when set;
//   2. the directory of the running executable;
//   3. ../lib/stratasim relative to it — where the build tree puts plugins (build/lib/stratasim/
//      for build/cli/stratasim, build/tests/test_*, build/bench/bench_*) and an installation
//      would (PREFIX/bin/stratasim, PREFIX/lib/stratasim/).
// Plugins are loaded with RTLD_NOW (a missing dependency or symbol fails the load, not a later
// call) and RTLD_GLOBAL (some of OpenMPI's components, which MPI_Init may load, use libmpi's
// symbols without linking libmpi: they find them in the global scope), and never unloaded.
#pragma once

#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace stratasim {

/// A plugin that was not found or did not load; the message names the file, where it was
/// looked for, and what is missing (the loader's message: a library, a symbol).
class PluginError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A loaded plugin.
struct Plugin {
  void* handle = nullptr;      // dlopen's handle
  std::filesystem::path path;  // the file that was loaded
};

/// The directories searched for plugins, in order (see above).
std::vector<std::filesystem::path> plugin_directories();

/// Loads `file_name` (e.g. "libstratasim_cuda.so") from the first directory that holds it.
/// Throws PluginError when no directory holds it or when it does not load.
Plugin load_plugin(const std::string& file_name);

/// The C-linkage function `name` of `plugin`, as a pointer of type F* (F a function type).
/// Throws PluginError when the plugin has no such symbol.
void* plugin_symbol(const Plugin& plugin, const char* name);
template <typename F>
F* plugin_function(const Plugin& plugin, const char* name) {
  return reinterpret_cast<F*>(plugin_symbol(plugin, name));
}

}  // namespace stratasim
