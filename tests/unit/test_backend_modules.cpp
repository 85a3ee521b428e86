// The optional backends as modules (src/backend_modules.hpp): nothing optional is mapped until a
// model or a device needs it, the module for a kind is loaded once, on first use, from
// asyncinfer/backends/ beside libasyncinfer, and a module that does not load fails the model that
// needed it in words naming both. CTest runs each test in its own process, so each starts with no
// module loaded.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "asyncinfer/device.hpp"
#include "asyncinfer/model.hpp"
#include "backend_modules.hpp"

namespace asyncinfer {
namespace {

// The shared objects this process has mapped (/proc/self/maps), one path per line.
std::string mapped() {
  std::ifstream maps("/proc/self/maps");
  std::stringstream text;
  text << maps.rdbuf();
  return text.str();
}

bool is_mapped(const std::string& name) { return mapped().find(name) != std::string::npos; }

TEST(BackendModules, LiveBesideTheLibrary) {
  const std::filesystem::path dir = detail::backend_module_directory();
  EXPECT_EQ(dir.filename(), "backends");
  EXPECT_EQ(dir.parent_path().filename(), "asyncinfer");
  EXPECT_TRUE(std::filesystem::is_directory(dir)) << dir;
  for (const detail::ModuleKind& k : detail::backend_module_kinds()) {
    EXPECT_TRUE(std::filesystem::exists(dir / ("libasyncinfer_" + std::string(k.module) + ".so")))
        << k.module;
  }
}

TEST(BackendModules, NothingOptionalIsMappedUntilAModelNeedsIt) {
  ASSERT_TRUE(open_device("cpu").ok());
  ASSERT_TRUE(load_model("builtin:identity").ok());
  // Listing what the build has loads nothing either.
  EXPECT_FALSE(model_backends().empty());
  EXPECT_FALSE(device_backends().empty());
  for (const char* name : {"libasyncinfer_", "libtorch", "libopenvino", "libcudart", "libcublas"}) {
    EXPECT_FALSE(is_mapped(name)) << name << " is mapped:\n" << mapped();
  }
#if ASYNCINFER_TEST_HAVE_PYTHON_BACKEND
  // A python model loads the python module, and only it: its file is missing, so the backend's own
  // error comes back, not the loader's.
  const auto python = load_model("python:/nonexistent/model.py");
  ASSERT_FALSE(python.ok());
  EXPECT_EQ(python.status().message().find("module"), std::string_view::npos)
      << python.status().message();
  EXPECT_TRUE(is_mapped("libasyncinfer_python.so"));
  EXPECT_FALSE(is_mapped("libtorch"));
  EXPECT_FALSE(is_mapped("libopenvino"));
#endif
#if ASYNCINFER_TEST_HAVE_TORCH
  EXPECT_FALSE(load_model("torch:/nonexistent/model.pt").ok());
  EXPECT_TRUE(is_mapped("libasyncinfer_torch.so"));
  EXPECT_TRUE(is_mapped("libtorch"));
#endif
}

#if ASYNCINFER_TEST_HAVE_PYTHON_BACKEND
// Threads that need the same module at once: one loads it, the others wait for it, and every one
// then finds the backend registered (its own error for a missing file, never "unknown model").
TEST(BackendModules, ThreadsThatNeedAModuleAtOnceAllFindIt) {
  constexpr int kThreads = 8;
  std::vector<std::string> answers(kThreads);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      const auto model = load_model("python:/nonexistent/" + std::to_string(i) + "/model.py");
      answers[static_cast<std::size_t>(i)] =
          model.ok() ? "loaded" : std::string(model.status().message());
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(answers[static_cast<std::size_t>(i)],
              "python model: no file /nonexistent/" + std::to_string(i) + "/model.py");
  }
}
#endif

TEST(BackendModules, AMissingModuleNamesItselfAndTheModel) {
  const std::filesystem::path empty = std::filesystem::temp_directory_path() /
                                      ("asyncinfer-no-backends-" + std::to_string(getpid()));
  std::filesystem::create_directories(empty);
  ASSERT_EQ(setenv("ASYNCINFER_BACKEND_DIRECTORY", empty.c_str(), 1), 0);
  for (const detail::ModuleKind& k : detail::backend_module_kinds()) {
    const std::string file = (empty / ("libasyncinfer_" + std::string(k.module) + ".so")).string();
    for (int attempt = 0; attempt < 2; ++attempt) {  // the second answer is the first's
      if (k.device) {
        const auto device = open_device(std::string(k.kind));
        ASSERT_FALSE(device.ok()) << k.kind;
        EXPECT_EQ(device.status().code(), StatusCode::unavailable);
        const std::string message(device.status().message());
        EXPECT_NE(message.find("device '" + std::string(k.kind) + "' needs the " +
                               std::string(k.module) + " backend module " + file + " did not load"),
                  std::string::npos)
            << message;
        continue;
      }
      const std::string uri = k.kind.starts_with("builtin:")
                                  ? std::string(k.kind)
                                  : std::string(k.kind) + ":/models/m/1/model";
      const auto model = load_model(uri);
      ASSERT_FALSE(model.ok()) << uri;
      EXPECT_EQ(model.status().code(), StatusCode::unavailable);
      const std::string message(model.status().message());
      EXPECT_NE(message.find("model '" + uri + "' needs the " + std::string(k.module) +
                             " backend module " + file + " did not load"),
                std::string::npos)
          << message;
      EXPECT_NE(message.find("ASYNCINFER_BACKEND_DIRECTORY"), std::string::npos) << message;
    }
  }
  std::filesystem::remove_all(empty);
}

}  // namespace
}  // namespace asyncinfer
