// engine.hpp — asyncinfer.Engine over asyncinfer::Engine (engine.cpp), and what AsyncInferQueue
// (async_infer_queue.cpp) shares with it.
//
// A thin layer (DESIGN.md §7): every call converts its arguments, calls the C++ engine once and
// converts the answer; the engine's queue, batching, deadlines, retries and metrics are the C++
// ones. What the binding adds is only what Python needs: the GIL released around blocking calls
// (infer, result, shutdown, and submit under QueueFullPolicy.block), the GIL taken for Python
// callbacks on the completion threads, exceptions from Status, and the exit hook (runtime.hpp).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "asyncinfer/engine.hpp"
#include "runtime.hpp"

namespace asyncinfer::python {

namespace py = pybind11;

/// Owns the C++ engine of one asyncinfer.Engine (not asyncinfer::EngineCore, the library's
/// internals): shared by the Python object, the exit registry and the engine's Python callbacks,
/// whose owner tag (CallbackScope) is its address; handed to the reaper when it must die elsewhere.
struct EngineHolder final : ExitStoppable {
  std::unique_ptr<Engine> engine;
  std::shared_ptr<BindingStats> stats = std::make_shared<BindingStats>();
  int exit_order() const noexcept override { return 2; }
  void stop_at_exit() noexcept override { engine->shutdown(ShutdownMode::drain); }
  void cancel_at_exit() noexcept override { engine->shutdown(ShutdownMode::cancel); }
};

/// The Python object.
class PyEngine {
 public:
  PyEngine(std::shared_ptr<Model> model, std::shared_ptr<Device> device, EngineOptions options);
  ~PyEngine();
  PyEngine(const PyEngine&) = delete;
  PyEngine& operator=(const PyEngine&) = delete;

  Engine& engine() const noexcept { return *holder_->engine; }
  const std::shared_ptr<EngineHolder>& holder() const noexcept { return holder_; }
  const std::shared_ptr<Model>& model() const noexcept { return model_; }
  const std::shared_ptr<Device>& device() const noexcept { return device_; }

 private:
  std::shared_ptr<Model> model_;
  std::shared_ptr<Device> device_;
  std::shared_ptr<EngineHolder> holder_;
};

/// The RequestOptions of submit()'s keyword arguments.
RequestOptions request_options(const py::object& timeout, int priority, const py::object& deadline,
                               const py::object& sequence_key, const py::object& tag);

/// Submits without the GIL only where it can block (QueueFullPolicy.block).
template <class F>
auto submit_call(const Engine& e, F&& f) -> decltype(f()) {
  if (e.options().queue_full_policy == QueueFullPolicy::block) return without_gil(f);
  return f();
}

/// The docstring paragraph on inputs and request options, shared by the submitting methods.
extern const char* const kInputsDoc;

/// Defines asyncinfer.Engine; after init_options.
void init_engine(py::module_& m);
/// Defines asyncinfer.AsyncInferQueue; after init_engine.
void init_async_infer_queue(py::module_& m);

}  // namespace asyncinfer::python
