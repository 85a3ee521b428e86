// Engine's public methods (engine.hpp): Engine::create with its option checks and the max batch
// size rule, and the thin forwarding to EngineCore (engine_core.hpp).
#include "asyncinfer/engine.hpp"

#include <algorithm>

#include "asyncinfer/detail/chrono.hpp"
#include "asyncinfer/detail/enum_names.hpp"
#include "core/spin_wait.hpp"
#include "engine/engine_core.hpp"

namespace asyncinfer {

namespace {
constexpr detail::EnumNames<RequestState, 8> kRequestStateNames{{"unknown", "pending", "running",
                                                                 "completed", "failed", "timed_out",
                                                                 "cancelled", "shut_down"}};
constexpr detail::EnumNames<WorkerHealth, 4> kWorkerHealthNames{
    {"healthy", "recovering", "paused", "unhealthy"}};
}  // namespace

std::string_view to_string(RequestState state) noexcept { return kRequestStateNames.name(state); }

std::ostream& operator<<(std::ostream& os, RequestState state) { return os << to_string(state); }

bool is_terminal(RequestState state) noexcept { return state >= RequestState::completed; }

std::string_view to_string(WorkerHealth health) noexcept { return kWorkerHealthNames.name(health); }

// ---- Engine -----------------------------------------------------------------------------------

namespace {
Status validate_options(const EngineOptions& o, const ModelSignature& sig, std::int64_t max_rows) {
  auto bad = [](const std::string& m) { return invalid_argument_error("EngineOptions: " + m); };
  if (o.workers < 1 || o.workers > 1024) return bad("workers must be in 1..1024");
  if (o.max_inflight_per_worker < 1) return bad("max_inflight_per_worker must be >= 1");
  if (o.queue_capacity < 1) return bad("queue_capacity must be >= 1");
  if (o.completion_threads < 1 || o.completion_threads > 256) {
    return bad("completion_threads must be in 1..256");
  }
  if (o.spin_wait.count() < 0 || o.spin_wait.count() > 1000) {
    return bad("spin_wait must be in 0..1000 us");
  }
  if (o.priority_levels < 1 || o.priority_levels > 64)
    return bad("priority_levels must be in 1..64");
  if (o.default_priority < 1 || o.default_priority > o.priority_levels) {
    return bad("default_priority must be in 1..priority_levels (" +
               std::to_string(o.priority_levels) + ")");
  }
  if (o.priority_aging.count() < 0) return bad("priority_aging must be >= 0");
  if (o.batching.max_queue_delay.count() < 0) return bad("batching.max_queue_delay must be >= 0");
  for (std::int64_t p : o.batching.preferred_batch_sizes) {
    if (p < 1 || p > max_rows) {
      return bad("preferred batch size " + std::to_string(p) + " is outside 1.." +
                 std::to_string(max_rows) + " (the max batch size" +
                 (sig.batched ? "" : "; the model is not batched") + ")");
    }
  }
  if (o.submit_timeout.count() < 0) return bad("submit_timeout must be >= 0");
  if (o.default_timeout && o.default_timeout->count() <= 0)
    return bad("default_timeout must be > 0");
  if (o.watchdog.count() < 0) return bad("watchdog must be >= 0");
  Status rec = o.recovery.validate();
  if (!rec.ok()) return rec.with_context("EngineOptions");
  if (o.breaker.failure_threshold < 0) return bad("breaker.failure_threshold must be >= 0");
  if (o.result_store_capacity < 1) return bad("result_store_capacity must be >= 1");
  if (o.result_ttl.count() < 0) return bad("result_ttl must be >= 0");
  if (o.intra_op_threads < 0) return bad("intra_op_threads must be >= 0");
  if (o.drain_timeout.count() < 0) return bad("drain_timeout must be >= 0");
  Status r = o.retry.validate();
  if (!r.ok()) return r.with_context("EngineOptions");
  return Status();
}
}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<Model> model,
                                               std::shared_ptr<Device> device,
                                               EngineOptions options) {
  if (!model) return invalid_argument_error("Engine::create: model is null");
  if (!device) return invalid_argument_error("Engine::create: device is null");
  const ModelSignature& sig = model->signature();
  // The max batch size rule (BatchingOptions::max_batch_size, engine.hpp).
  const std::optional<std::int64_t> asked = options.batching.max_batch_size;
  if (asked && *asked < 1) {
    return invalid_argument_error("EngineOptions: batching.max_batch_size " +
                                  std::to_string(*asked) +
                                  " must be >= 1 (unset = the model's batch limit)");
  }
  if (sig.batched && sig.batch_limit && *sig.batch_limit < 1) {
    return invalid_argument_error("Engine::create: the model's batch limit is " +
                                  std::to_string(*sig.batch_limit) +
                                  "; ModelSignature::batch_limit must be >= 1 or unset (no limit)");
  }
  std::int64_t max_rows = 1;
  if (sig.batched) {
    if (asked && sig.batch_limit && *asked > *sig.batch_limit) {
      return invalid_argument_error("EngineOptions: batching.max_batch_size " +
                                    std::to_string(*asked) + " exceeds the model's batch limit " +
                                    std::to_string(*sig.batch_limit) + " (unset = the model's)");
    }
    max_rows = asked.value_or(sig.batch_limit.value_or(kDefaultMaxBatchSize));
  }
  for (const TensorSpec& in : sig.inputs) {
    if (in.ragged && !(device->info().unified_memory && model->takes_requests_apart())) {
      return invalid_argument_error(
          "Engine::create: input '" + in.name + "' of model '" + model->name() +
          "' is ragged (TensorSpec::ragged, Triton's allow_ragged_batch), which only a model "
          "that takes a batch's requests apart (Model::takes_requests_apart: the python "
          "backend, the identity) serves, on a device whose memory is the host's");
    }
  }
  if (options.workers < 0) return invalid_argument_error("EngineOptions: workers must be >= 0");
  options = resolve_options(*model, *device, std::move(options));
  ASYNCINFER_RETURN_IF_ERROR(validate_options(options, sig, max_rows));
  if (options.sequence_batching) {
    SequenceBatchingOptions& q = *options.sequence_batching;
    if (q.model_name.empty()) q.model_name = model->name();  // what the errors call it
    if (sig.decoupled) {
      return invalid_argument_error(
          "EngineOptions: sequence_batching with a decoupled model is not supported");
    }
    if (q.slots_per_worker < 0 || q.max_sequence_idle.count() <= 0) {
      return invalid_argument_error(
          "EngineOptions: sequence_batching: slots_per_worker must be >= 0 and "
          "max_sequence_idle > 0");
    }
    ASYNCINFER_RETURN_IF_ERROR(detail::SequencePlan::make(q, sig).status());
    // Batches form from the slots' sequences: no dynamic batching delay, no retries.
    options.batching.max_queue_delay = std::chrono::microseconds(0);
    options.retry.max_attempts = 1;
    // A sequence's results reach their callbacks in its order (keyed by its ID), as they run:
    // a stream that answers each as it completes keeps the sequence's order (Triton's).
    options.ordered_delivery = true;
  }
  options.batching.max_batch_size = max_rows;  // what Engine::options() reports
  // After the validation, so that a bad value is refused whatever the affinity.
  options.spin_wait = detail::SpinPolicy::from_option(options.spin_wait).budget();
  auto core = std::make_shared<EngineCore>(std::move(model), std::move(device), std::move(options),
                                           max_rows);
  Status s = core->start();
  if (!s.ok()) {
    core->shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
    return s;
  }
  return std::unique_ptr<Engine>(new Engine(std::move(core)));
}

EngineOptions Engine::resolve_options(const Model& model, const Device& device,
                                      EngineOptions options) {
  // The thread rule (docs/models.md, "Threads"): single-thread instances, one per core where the
  // model computes on host cores. A team of intra-op threads spins at every parallel region for
  // its slowest member and collapses when another process takes a core; workers do not.
  constexpr int kMaxAutoWorkers = 16;  // each worker holds its own copy of the model
  if (options.workers == 0) {
    const int preferred = model.preferred_instances(device);
    if (preferred > 0) {
      options.workers = std::min(preferred, kMaxAutoWorkers);
    } else {
      options.workers =
          model.uses_host_cores(device) ? std::min(detail::available_cores(), kMaxAutoWorkers) : 1;
    }
  }
  if (options.intra_op_threads == 0) options.intra_op_threads = 1;
  options.max_inflight_per_worker =
      std::max(options.max_inflight_per_worker, model.pipelined_batches());
  return options;
}

Engine::Engine(std::shared_ptr<EngineCore> core) : core_(std::move(core)) {}

Engine::~Engine() {
  if (core_) core_->shutdown(ShutdownMode::drain, core_->options().drain_timeout);
}

Result<Outputs> Engine::infer(Inputs inputs, const RequestOptions& options) {
  return core_->submit_future(std::move(inputs), options).get();
}

Future<Outputs> Engine::submit(Inputs inputs, const RequestOptions& options) {
  return core_->submit_future(std::move(inputs), options);
}

Result<Future<Outputs>> Engine::try_submit(Inputs inputs, const RequestOptions& options) {
  return core_->try_submit_future(std::move(inputs), options);
}

Status Engine::submit(Inputs inputs, Callback callback, const RequestOptions& options) {
  return core_->submit_callback(std::move(inputs), std::move(callback), options);
}

Status Engine::submit(std::string id, Inputs inputs, const RequestOptions& options) {
  return core_->submit_id(std::move(id), std::move(inputs), options);
}

Result<Outputs> Engine::result(std::string_view id, std::chrono::nanoseconds timeout) {
  return core_->result(id, timeout);
}

RequestState Engine::status(std::string_view id) const { return core_->status(id); }

Status Engine::cancel(std::string_view id) { return core_->cancel(id); }

Status Engine::release(std::string_view id) { return core_->release(id); }

void Engine::shutdown(ShutdownMode mode, std::optional<std::chrono::milliseconds> drain_timeout) {
  core_->shutdown(mode, drain_timeout.value_or(core_->options().drain_timeout));
}

EngineMetrics Engine::metrics() const { return core_->metrics(); }

EngineHealth Engine::health() const { return core_->health(); }

const ModelSignature& Engine::signature() const noexcept { return core_->signature(); }

const ModelSignature& Engine::request_signature() const noexcept {
  return core_->request_signature();
}

const EngineOptions& Engine::options() const noexcept { return core_->options(); }

Device& Engine::device() const noexcept { return core_->device(); }

}  // namespace asyncinfer
