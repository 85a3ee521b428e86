// EngineContext (engine_context.hpp): its construction and the health-change hook. The ends of
// a failed batch are BatchFailure's (batch_failure.cpp); the counters' metrics are filled in
// engine_metrics.cpp; the check of a model's outputs is in worker.cpp.
#include "engine/engine_context.hpp"

namespace asyncinfer::detail {

EngineContext::EngineContext(Model& the_model, Device& the_device, const EngineOptions& options,
                             const ModelSignature& signature, const SequencePlan* plan,
                             std::int64_t batch_rows, bool run_inline, Executor& dispatcher,
                             DeadlineTimer& deadline_timer, ThreadPool& reaper_pool,
                             Scheduler& the_scheduler, Resolver& the_resolver)
    : model(the_model),
      device(the_device),
      opt(options),
      sig(signature),
      sequence_plan(plan),
      max_rows(batch_rows),
      unified(the_device.info().unified_memory),
      apart(unified && the_model.takes_requests_apart()),
      coalesce(apart && batch_rows == 1 && plan == nullptr && the_model.coalesced_requests() > 1
                   ? the_model.coalesced_requests()
                   : 0),
      inline_path(run_inline),
      spin(options.spin_wait),
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
      resolver(the_resolver),
      failures(options, plan, the_scheduler, the_resolver, deadline_timer, counters) {}

void EngineContext::health_changed() noexcept {
  if (!opt.on_health_change) return;
  try {
    opt.on_health_change();
  } catch (...) {
    detail::report_callback_exception("on_health_change", std::current_exception());
  }
}

}  // namespace asyncinfer::detail
