#include "hw_models/plugin.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <system_error>

namespace fs = std::filesystem;

namespace stratasim {

std::vector<fs::path> plugin_directories() {
  std::vector<fs::path> dirs;
  if (const char* dir = std::getenv("STRATASIM_PLUGIN_DIR"); dir != nullptr && *dir != '\0') {
    dirs.emplace_back(dir);
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    dirs.push_back(exe.parent_path());
    dirs.push_back((exe.parent_path() / ".." / "lib" / "stratasim").lexically_normal());
  }
  return dirs;
}

Plugin load_plugin(const std::string& file_name) {
  const auto dirs = plugin_directories();
  std::string looked;
  for (const fs::path& dir : dirs) {
    const fs::path file = dir / file_name;
    std::error_code ec;
    if (!fs::is_regular_file(file, ec)) {
      looked += (looked.empty() ? "" : ", ") + dir.string();
      continue;
    }
    void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      throw PluginError("cannot load " + file.string() + ": " +
                        (why != nullptr ? why : "dlopen failed"));
    }
    return {handle, file};
  }
  throw PluginError(file_name + " was not found (looked in " +
                    (looked.empty() ? std::string("no directory") : looked) +
                    "; STRATASIM_PLUGIN_DIR names another directory)");
}

void* plugin_symbol(const Plugin& plugin, const char* name) {
  dlerror();
  void* symbol = dlsym(plugin.handle, name);
  if (symbol == nullptr) {
    throw PluginError(plugin.path.string() + " has no entry point " + name +
                      " (it is not a stratasim plugin of this version)");
  }
  return symbol;
}

}  // namespace stratasim
