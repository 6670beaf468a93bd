// Finding and loading plugins (hw_models/plugin.hpp): the directories, the errors, and a real
// load of a library whose place and symbols the test learns from the dynamic loader.
#include <cxxabi.h>
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "hw_models/plugin.hpp"
#include "temp_dir.hpp"

using namespace stratasim;
namespace fs = std::filesystem;

namespace {

// Sets STRATASIM_PLUGIN_DIR for its lifetime (or unsets it), then restores it.
class PluginDirGuard {
 public:
  explicit PluginDirGuard(const std::optional<std::string>& value) {
    if (const char* old = std::getenv("STRATASIM_PLUGIN_DIR")) old_ = old;
    if (value) {
      setenv("STRATASIM_PLUGIN_DIR", value->c_str(), 1);
    } else {
      unsetenv("STRATASIM_PLUGIN_DIR");
    }
  }
  ~PluginDirGuard() {
    if (old_) {
      setenv("STRATASIM_PLUGIN_DIR", old_->c_str(), 1);
    } else {
      unsetenv("STRATASIM_PLUGIN_DIR");
    }
  }
  PluginDirGuard(const PluginDirGuard&) = delete;
  PluginDirGuard& operator=(const PluginDirGuard&) = delete;

 private:
  std::optional<std::string> old_;
};

std::string error_of(const std::string& file) {
  try {
    load_plugin(file);
  } catch (const PluginError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("plugin: looked for in STRATASIM_PLUGIN_DIR, the executable's folder, ../lib/stratasim") {
  const fs::path exe = fs::read_symlink("/proc/self/exe").parent_path();
  {
    const PluginDirGuard env(std::nullopt);
    const auto dirs = plugin_directories();
    REQUIRE(dirs.size() == 2);
    CHECK(dirs[0] == exe);
    CHECK(dirs[1] == (exe.parent_path() / "lib" / "stratasim"));
  }
  const PluginDirGuard env(std::string("/opt/somewhere"));
  const auto dirs = plugin_directories();
  REQUIRE(dirs.size() == 3);
  CHECK(dirs[0] == fs::path("/opt/somewhere"));
  CHECK(dirs[1] == exe);
}

TEST_CASE("plugin: one that is not there is an error naming it and where it was looked for") {
  const testing::TempDir tmp("plugin-absent");
  const fs::path dir = tmp.path();
  const PluginDirGuard env(dir.string());
  const std::string message = error_of("libstratasim_absent.so");
  CHECK(message.find("libstratasim_absent.so was not found") != std::string::npos);
  CHECK(message.find(dir.string()) != std::string::npos);
  CHECK(message.find("STRATASIM_PLUGIN_DIR") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("plugin: a file that does not load is an error naming it and the loader's reason") {
  const testing::TempDir tmp("plugin-broken");
  const fs::path dir = tmp.path();
  std::ofstream(dir / "libstratasim_broken.so") << "not a shared library\n";
  const PluginDirGuard env(dir.string());
  const std::string message = error_of("libstratasim_broken.so");
  CAPTURE(message);
  CHECK(message.find("cannot load " + (dir / "libstratasim_broken.so").string() + ": ") !=
        std::string::npos);
  CHECK(message.size() >
        ("cannot load " + (dir / "libstratasim_broken.so").string() + ": ").size());
  fs::remove_all(dir);
}

TEST_CASE("plugin: loads a library from the first folder that has it and finds its C functions") {
  // The C++ runtime's file and one of its C functions, as the dynamic loader knows them.
  Dl_info info{};
  REQUIRE(dladdr(reinterpret_cast<void*>(&abi::__cxa_demangle), &info) != 0);
  const fs::path library = fs::canonical(info.dli_fname);
  const PluginDirGuard env(library.parent_path().string());
  const Plugin plugin = load_plugin(library.filename().string());
  CHECK(fs::canonical(plugin.path) == library);
  using Demangle = char*(const char*, char*, std::size_t*, int*);
  Demangle* demangle = plugin_function<Demangle>(plugin, "__cxa_demangle");
  const bool same = demangle == &abi::__cxa_demangle;
  CHECK(same);
  int status = -1;
  char* name = demangle("_ZN9stratasim4TimeE", nullptr, nullptr, &status);
  REQUIRE(status == 0);
  CHECK(std::string(name) == "stratasim::Time");
  std::free(name);
  try {
    plugin_symbol(plugin, "stratasim_no_such_entry");
    FAIL("expected a PluginError");
  } catch (const PluginError& e) {
    CHECK(std::string(e.what()).find("has no entry point stratasim_no_such_entry") !=
          std::string::npos);
  }
}
