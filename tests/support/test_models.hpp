// A scriptable model for engine tests: records every call (time, instance, the first element of
// each item) and lets the test decide, per call, to fail, to take time, or both.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "asyncinfer/model.hpp"

namespace asyncinfer::testing {

struct Call {
  Clock::time_point at;
  int instance;
  std::int64_t index;         ///< global call number, from 1
  std::vector<float> firsts;  ///< first element of each item of the batch
  std::int64_t cols = 0;      ///< dim 1 of the batch
};

/// What a call does: return an error to fail it (in stream order), ok to succeed; `delay` is
/// how long the stream is busy first.
struct Decision {
  Status status;
  std::chrono::microseconds delay{0};
};

class ScriptedModel final : public Model, public std::enable_shared_from_this<ScriptedModel> {
 public:
  using Script = std::function<Decision(const Call&)>;

  /// max_batch: the model's batch limit (ModelSignature::batch_limit); nullopt = none.
  explicit ScriptedModel(Script script, std::optional<std::int64_t> max_batch = 64)
      : script_(std::move(script)) {
    sig_.batched = true;
    sig_.batch_limit = max_batch;
    sig_.inputs.push_back({"x", DType::f32, {-1, -1}});
    sig_.outputs.push_back({"y", DType::f32, {-1, -1}});
  }

  const ModelSignature& signature() const noexcept override { return sig_; }
  const std::string& name() const noexcept override { return name_; }
  bool cancellable() const noexcept override { return true; }
  bool supports_caller_runs() const noexcept override { return true; }

  Result<std::unique_ptr<ModelInstance>> create_instance(Device&, Stream&,
                                                         const InstanceOptions& o) override {
    return std::unique_ptr<ModelInstance>(
        std::make_unique<Instance>(shared_from_this(), next_instance_++, o.worker_index));
  }

  std::vector<Call> calls() const {
    std::lock_guard lock(mu_);
    return calls_;
  }
  int instances_created() const { return next_instance_.load(); }

 private:
  class Instance final : public ModelInstance {
   public:
    Instance(std::shared_ptr<ScriptedModel> m, int id, int worker)
        : model_(std::move(m)), id_(id), worker_(worker) {}
    Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
      Call call;
      call.at = Clock::now();
      call.instance = worker_;
      const Tensor& in = io->host_inputs.at(0);
      const std::int64_t rows = in.dim(0);
      const std::int64_t cols = rows == 0 ? 0 : static_cast<std::int64_t>(in.numel()) / rows;
      for (std::int64_t r = 0; r < rows; ++r) call.firsts.push_back(in.data_as<float>()[r * cols]);
      call.cols = cols;
      {
        std::lock_guard lock(model_->mu_);
        call.index = static_cast<std::int64_t>(model_->calls_.size()) + 1;
        model_->calls_.push_back(call);
      }
      const Decision d = model_->script_(call);
      auto out = Tensor::empty(DType::f32, in.shape());
      if (!out.ok()) return out.status();
      io->outputs = {*out};
      Kernel k;
      k.name = "scripted";
      k.duration = d.delay;
      k.stop = io->stop;
      k.host_fn = [io, d](std::stop_token) {
        if (!d.status.ok()) return d.status;
        std::memcpy(io->outputs[0].data(), io->inputs[0].data(), io->inputs[0].byte_size());
        return Status();
      };
      return stream.enqueue(std::move(k));
    }

   private:
    std::shared_ptr<ScriptedModel> model_;
    int id_;
    int worker_;
  };

  Script script_;
  ModelSignature sig_;
  std::string name_ = "scripted";
  std::atomic<int> next_instance_{0};
  mutable std::mutex mu_;
  std::vector<Call> calls_;
};

}  // namespace asyncinfer::testing

namespace asyncinfer::testing {

/// A model for the recovery tests, doing what real devices and libraries do to a server:
///   - create_instance fails once `good_instances` instances exist (a lost device);
///   - enqueue may block the worker thread (`enqueue_block`, per call);
///   - the work may run for a while on the stream thread ignoring every stop token (`work`, per
///     call): uncancellable, like a libtorch forward or a CUDA kernel already launched.
/// It counts the work running at once (running, max_running), so a test can check how much the
/// engine really has on the device. Calls are numbered from 1 across instances.
class ControlledModel final : public Model, public std::enable_shared_from_this<ControlledModel> {
 public:
  using PerCall = std::function<std::chrono::milliseconds(int call)>;

  /// `throws`: a failing create_instance throws instead of returning an error.
  ControlledModel(int good_instances, PerCall work, PerCall enqueue_block = {}, bool throws = false)
      : good_instances_(good_instances),
        throws_(throws),
        work_(std::move(work)),
        enqueue_block_(std::move(enqueue_block)) {
    sig_.batched = true;
    sig_.batch_limit = 64;
    sig_.inputs.push_back({"x", DType::f32, {-1, -1}});
    sig_.outputs.push_back({"y", DType::f32, {-1, -1}});
  }

  const ModelSignature& signature() const noexcept override { return sig_; }
  const std::string& name() const noexcept override { return name_; }

  Result<std::unique_ptr<ModelInstance>> create_instance(Device&, Stream&,
                                                         const InstanceOptions&) override {
    ++create_calls_;
    if (instances_.load() >= good_instances_) {
      if (throws_) throw std::runtime_error("driver: device lost (thrown)");
      return unavailable_error("device lost: no instance can be created (attempt " +
                               std::to_string(create_calls_.load()) + ")");
    }
    ++instances_;
    return std::unique_ptr<ModelInstance>(std::make_unique<Instance>(shared_from_this()));
  }

  int calls() const { return calls_.load(); }
  int running() const { return running_.load(); }
  int max_running() const { return max_running_.load(); }
  int instances() const { return instances_.load(); }
  int create_calls() const { return create_calls_.load(); }

 private:
  class Instance final : public ModelInstance {
   public:
    explicit Instance(std::shared_ptr<ControlledModel> m) : model_(std::move(m)) {}
    Status enqueue(Stream& stream, const std::shared_ptr<BatchIO>& io) override {
      const int call = ++model_->calls_;
      if (model_->enqueue_block_) std::this_thread::sleep_for(model_->enqueue_block_(call));
      auto out = Tensor::empty(DType::f32, io->inputs.at(0).shape());
      if (!out.ok()) return out.status();
      io->outputs = {*out};
      const std::chrono::milliseconds work =
          model_->work_ ? model_->work_(call) : std::chrono::milliseconds(0);
      Kernel k;
      k.name = "controlled";
      k.host_fn = [m = model_, io, work](std::stop_token) {
        const int now = ++m->running_;
        int seen = m->max_running_.load();
        while (now > seen && !m->max_running_.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::sleep_for(work);  // ignores every stop token: uncancellable
        --m->running_;
        std::memcpy(io->outputs[0].data(), io->inputs[0].data(), io->inputs[0].byte_size());
        return Status();
      };
      return stream.enqueue(std::move(k));
    }

   private:
    std::shared_ptr<ControlledModel> model_;
  };

  const int good_instances_;
  const bool throws_;
  PerCall work_;
  PerCall enqueue_block_;
  ModelSignature sig_;
  std::string name_ = "controlled";
  std::atomic<int> calls_{0};
  std::atomic<int> running_{0};
  std::atomic<int> max_running_{0};
  std::atomic<int> instances_{0};
  std::atomic<int> create_calls_{0};
};

}  // namespace asyncinfer::testing
