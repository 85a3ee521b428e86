// EngineContext (engine_context.hpp): its construction, the health-change hook and the end of
// everything waiting when the last worker gave up. The ends of a failed batch are in
// batch_failure.cpp and retry_scheduler.cpp; the check of a model's outputs in worker.cpp.
#include "engine/engine_context.hpp"

namespace asyncinfer::detail {

EngineContext::EngineContext(Model& the_model, Device& the_device, const EngineOptions& options,
                             const ModelSignature& signature, std::int64_t batch_rows,
                             bool run_inline, Executor& dispatcher, DeadlineTimer& deadline_timer,
                             ThreadPool& reaper_pool, Scheduler& the_scheduler,
                             Resolver& the_resolver)
    : model(the_model),
      device(the_device),
      opt(options),
      sig(signature),
      max_rows(batch_rows),
      unified(the_device.info().unified_memory),
      inline_path(run_inline),
      // The completion point enqueues copies, records events and frees the batch's device
      // memory: it runs on the thread that reaches it in the stream only where that thread may
      // call the device (DeviceCapabilities::host_funcs_may_call_device); elsewhere the
      // dispatcher runs it.
      completion_point(the_device.capabilities().host_funcs_may_call_device
                           ? static_cast<Executor&>(inline_executor)
                           : dispatcher),
      timer(deadline_timer),
      reaper(reaper_pool),
      scheduler(the_scheduler),
      resolver(the_resolver) {}

void EngineContext::no_worker_left(const std::string& cause) {
  const Status st = unavailable_error("no worker of the engine can serve requests: " + cause);
  // Later submits are refused with `st` (blocked ones too); what waits ends with it.
  for (auto& r : scheduler.no_workers(st)) end_unservable(r, st, "");
  scheduler.wake_all();
}

void EngineContext::health_changed() noexcept {
  if (!opt.on_health_change) return;
  try {
    opt.on_health_change();
  } catch (...) {
    detail::report_callback_exception("on_health_change", std::current_exception());
  }
}

}  // namespace asyncinfer::detail
