// Pipeline and its PipelineCore (asyncinfer/pipeline.hpp): items that pass through host, device
// and engine stages in order, each stage with its own threads and queue.
//
// Threads: each host stage has `concurrency` threads; each device (and model) stage has one
// thread that enqueues items on the stage's stream; each engine stage has one thread that submits
// to the engine. One dispatcher thread receives the streams' completion points; completion
// threads run future continuations; one timer thread fires item deadlines.
//
// An item holds a window slot from submit until it is retired. It is retired once it has ended
// (ok, failed, timed out, cancelled, shut down), sits in no stage queue, and no stage is working on
// it (`outstanding` counts host functions running and device work enqueued). A stage increments
// `outstanding` before it looks at the item's state, and whoever ends an item looks at
// `outstanding` after ending it (both sequentially consistent), so an item is never retired while
// a stage still uses it — and its slot's events are reused only after its device work has passed.
//
// One file of about 760 lines, on purpose: PipelineCore is one class, defined here only, and the
// retirement rule above is kept by functions from every part of it: pop() and done_with() (the
// stages), end() and maybe_retire() (ending), and shutdown(), which ends what is left and lets go
// of the queues no thread serves any more. Split into files, the rule could not be checked in one
// reading. The public value types (StageSpec's builders, PipelineMetrics) are in
// pipeline_types.cpp; what it shares with the engine (outcomes, counters, time helpers) is in
// engine/lifecycle.hpp.
//
// Its sections, in order: the item and stage records (PItem, Stage); PipelineCore's public face,
// what Pipeline calls (constructor, init, submit, shutdown, metrics, drain_timeout); then, private,
// a stage's set-up (init_stage), moving items between stages (push, pop, advance, fail, done_with,
// take), the stage threads (account, guarded, host_loop, engine_loop, device_loop, enqueue_model,
// on_device_done), ending and retiring, its state; then Pipeline, which checks its options and
// forwards to PipelineCore.
#include "asyncinfer/pipeline.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "asyncinfer/executor.hpp"
#include "core/ordered_delivery.hpp"
#include "engine/lifecycle.hpp"

namespace asyncinfer {

namespace {

using detail::deadline_after;
using detail::saturating_add;

using detail::elapsed_s_since;
using detail::elapsed_us_since;
using detail::Outcome;

struct PItem {
  /// Unique for the pipeline's life: the item's key in active_, the stage queues (after its
  /// priority, so FIFO within a level) and engine_calls_.
  std::uint64_t id = 0;
  /// Its number in the delivery sequence (order_). Not an identity: once every number has been
  /// delivered the sequence is forgotten and numbering starts again at 0, while an item
  /// delivered early (ended while a stage still holds it) may not be retired yet.
  std::uint64_t seq = 0;
  int slot = -1;
  int level = 0;
  Clock::time_point submitted{};
  Clock::time_point deadline = Clock::time_point::max();
  PipelineItem data;
  std::atomic<bool> ended{false};  // set once, by end(), with the item's Outcome
  Promise<PipelineItem> promise;
  std::stop_source stop;              // fired when the item ends early
  Event* ready_event = nullptr;       // for the next device stage to wait on
  std::shared_ptr<BatchIO> model_io;  // model stage whose outputs appear in stream order
  std::atomic<int> outstanding{0};
  std::atomic<int> queued_stage{-1};
  std::atomic<int> at_stage{0};
  std::atomic<bool> retired{false};
  Clock::time_point stage_enter{};  // written by the pusher, read by the popper
  std::mutex timer_mu;
  TimerId deadline_timer;
};

using ItemPtr = std::shared_ptr<PItem>;

struct Stage {
  StageSpec spec;
  int index = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::pair<int, std::uint64_t>, ItemPtr> queue;  // (level, id): priority, then FIFO
  int inflight = 0;                                        // device: on the stream, not done
  std::unique_ptr<Stream> stream;
  std::vector<std::unique_ptr<Event>> events;  // one per window slot
  std::unique_ptr<ModelInstance> instance;
  bool unified = true;
  std::vector<std::jthread> threads;
  Clock::time_point last_done{};  // device: dispatcher thread only
  std::atomic<std::uint64_t> items{0};
  std::atomic<std::uint64_t> failures{0};
  std::atomic<double> busy_s{0};
  Histogram queue_us;
  Histogram service_us;
};

struct Ready {
  ItemPtr item;
  Result<PipelineItem> result;
};

}  // namespace

class PipelineCore {
 public:
  // ---- set-up -----------------------------------------------------------------------------------

  explicit PipelineCore(PipelineOptions options)
      : opt_(options),
        completion_(static_cast<std::size_t>(options.completion_threads), "ai-pl-callback"),
        dispatcher_(1, "ai-pl-dispatch"),
        timer_("ai-pl-timer") {}

  ~PipelineCore() { shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0)); }

  Status init(std::vector<StageSpec> specs) {
    for (std::size_t i = 0; i < opt_.window; ++i) free_slots_.push_back(static_cast<int>(i));
    for (std::size_t i = 0; i < specs.size(); ++i) {
      auto st = std::make_unique<Stage>();
      st->spec = std::move(specs[i]);
      st->index = static_cast<int>(i);
      Status s = init_stage(*st);
      if (!s.ok()) return s.with_context("stage '" + st->spec.name + "'");
      stages_.push_back(std::move(st));
    }
    for (auto& st : stages_) {
      Stage* sp = st.get();
      const int threads = sp->spec.kind == StageKind::host ? sp->spec.concurrency : 1;
      for (int t = 0; t < threads; ++t) {
        sp->threads.emplace_back([this, sp, t] {
          detail::setup_thread("ai-pl-" + sp->spec.name + "-" + std::to_string(t));
          switch (sp->spec.kind) {
            case StageKind::host:
              host_loop(*sp);
              break;
            case StageKind::device:
              device_loop(*sp);
              break;
            case StageKind::engine:
              engine_loop(*sp);
              break;
          }
        });
      }
    }
    return Status();
  }

  // ---- submission -------------------------------------------------------------------------

  Future<PipelineItem> submit(PipelineItem&& data, const ItemOptions& o) {
    const int level = (o.priority == 0 ? opt_.default_priority : o.priority) - 1;
    if (level < 0 || level >= opt_.priority_levels) {
      return make_ready_future<PipelineItem>(invalid_argument_error(
          "pipeline: priority " + std::to_string(o.priority) + " is outside 1.." +
          std::to_string(opt_.priority_levels) + " (0 = the default)"));
    }
    auto item = std::make_shared<PItem>();
    item->data = std::move(data);
    item->level = level;
    // Everything about the item is set before it is published (active_, a queue), where a
    // concurrent shutdown may end it.
    const Clock::time_point now = Clock::now();
    item->submitted = now;
    Clock::time_point d = Clock::time_point::max();
    if (o.timeout) d = saturating_add(now, *o.timeout);
    if (o.deadline && *o.deadline < d) d = *o.deadline;
    item->deadline = d;
    Future<PipelineItem> f = item->promise.get_future();
    // Continuations run on the completion executor; with ordered delivery they are posted in
    // order, and with one completion thread (the default) they also run in order.
    item->promise.set_callback_executor(&completion_);
    {
      std::unique_lock lock(window_mu_);
      window_cv_.wait(lock, [this] { return stopping_ || !free_slots_.empty(); });
      if (stopping_) {
        item->promise.set_error(
            unavailable_error("pipeline is shut down: no new items are accepted"));
        return f;
      }
      item->slot = free_slots_.back();
      free_slots_.pop_back();
      // Its number in the one delivery sequence (PipelineOptions::ordered): every item accepted
      // here reaches deliver() exactly once, whatever its outcome.
      item->seq = order_.assign();
      item->id = next_id_++;
      ++in_flight_;
      max_in_flight_ = std::max(max_in_flight_, in_flight_);
      active_.emplace(item->id, item);
      if (!first_submit_) first_submit_ = now;
    }
    submitted_.fetch_add(1, std::memory_order_relaxed);
    item->promise.on_cancel([this, weak = std::weak_ptr<PItem>(item)] {
      if (auto it = weak.lock()) {
        end(it, Outcome::cancelled, cancelled_error("item cancelled by the caller"));
      }
    });
    if (d != Clock::time_point::max()) {
      std::lock_guard tl(item->timer_mu);
      item->deadline_timer = timer_.add(d, [this, item] {
        const int at = item->at_stage.load();
        std::string where =
            at >= 0 && at < static_cast<int>(stages_.size())
                ? " at stage '" + stages_[static_cast<std::size_t>(at)]->spec.name + "'"
                : "";
        end(item, Outcome::timed_out,
            deadline_exceeded_error("item timed out" + where + " after " +
                                    detail::ms_text(Clock::now() - item->submitted)));
      });
    }
    push(*stages_[0], item);
    return f;
  }

  // ---- shutdown and metrics ---------------------------------------------------------------

  void shutdown(ShutdownMode mode, std::chrono::milliseconds drain_timeout) {
    std::unique_lock guard(shutdown_mu_, std::try_to_lock);
    if (!guard.owns_lock()) {
      // Another thread is shutting down: a cancel cuts its drain short (what is in flight ends
      // now), then both wait for that shutdown to finish, as Engine::shutdown does.
      if (mode == ShutdownMode::cancel) {
        {
          std::lock_guard lock(window_mu_);
          cut_drain_ = true;
        }
        drain_cv_.notify_all();
      }
      guard.lock();
    }
    if (shut_) return;
    {
      std::lock_guard lock(window_mu_);
      stopping_ = true;
    }
    window_cv_.notify_all();
    bool drained = mode == ShutdownMode::drain;
    if (drained) {
      std::unique_lock lock(window_mu_);
      drain_cv_.wait_until(lock, deadline_after(drain_timeout),
                           [this] { return in_flight_ == 0 || cut_drain_; });
      drained = in_flight_ == 0;
    }
    if (!drained) {
      std::vector<ItemPtr> items;
      {
        std::lock_guard lock(window_mu_);
        for (auto& [id, it] : active_) items.push_back(it);
      }
      for (auto& it : items) {
        end(it, Outcome::shut_down, aborted_error("pipeline shut down before the item finished"));
      }
    }
    stop_stages_.store(true);
    for (auto& st : stages_) {
      { std::lock_guard lock(st->mu); }  // a stage thread between its check and its wait sees it
      st->cv.notify_all();
    }
    for (auto& st : stages_) {
      for (auto& t : st->threads) {
        if (t.joinable()) t.join();
      }
    }
    {
      // Requests still inside engine stages: cancel them (they end at once) and wait for their
      // callbacks, which use this pipeline.
      std::unique_lock lock(engine_mu_);
      for (auto& [id, call] : engine_calls_) call.cancel();
      engine_cv_.wait(lock, [this] { return engine_pending_ == 0; });
      engine_calls_.clear();
    }
    // An item a stage handed on while the stages stopped can sit in a queue no thread serves any
    // more; every item has ended by now, so let them go.
    for (auto& st : stages_) {
      std::vector<ItemPtr> left;
      {
        std::lock_guard lock(st->mu);
        for (auto& [key, item] : st->queue) {
          item->queued_stage.store(-1);
          left.push_back(std::move(item));
        }
        st->queue.clear();
      }
      for (auto& item : left) maybe_retire(item);
    }
    // Destroying the streams stops what still runs (where the backend can) and delivers their
    // pending completion points to the dispatcher, which retires the items.
    for (auto& st : stages_) {
      st->stream.reset();
      st->instance.reset();
    }
    dispatcher_.shutdown();
    completion_.shutdown();
    timer_.shutdown();
    shut_ = true;
  }

  PipelineMetrics metrics() const {
    PipelineMetrics m;
    m.submitted = submitted_.load();
    m.completed = outcomes_.completed.load();
    m.failed = outcomes_.failed.load();
    m.timed_out = outcomes_.timed_out.load();
    m.cancelled = outcomes_.cancelled.load();
    m.shut_down = outcomes_.shut_down.load();
    {
      std::lock_guard lock(window_mu_);
      m.in_flight = in_flight_;
      m.max_in_flight = max_in_flight_;
      if (first_submit_) {
        m.elapsed_s = elapsed_s_since(*first_submit_);
      }
    }
    m.items_per_s = m.elapsed_s > 0 ? static_cast<double>(m.completed) / m.elapsed_s : 0;
    for (const auto& st : stages_) {
      StageMetrics s;
      s.name = st->spec.name;
      s.kind = st->spec.kind == StageKind::host     ? "host"
               : st->spec.kind == StageKind::device ? "device"
                                                    : "engine";
      s.concurrency = st->spec.kind == StageKind::host ? st->spec.concurrency : 1;
      s.items = st->items.load();
      s.failures = st->failures.load();
      s.busy_s = st->busy_s.load();
      s.utilisation =
          m.elapsed_s > 0 ? s.busy_s / (m.elapsed_s * static_cast<double>(s.concurrency)) : 0;
      {
        std::lock_guard lock(st->mu);
        s.queued = static_cast<std::int64_t>(st->queue.size());
      }
      s.queue_us = st->queue_us.snapshot();
      s.service_us = st->service_us.snapshot();
      m.stages.push_back(std::move(s));
    }
    m.latency_us = latency_us_.snapshot();
    return m;
  }

  /// PipelineOptions::drain_timeout, for Pipeline's destructor and shutdown().
  std::chrono::milliseconds drain_timeout() const noexcept { return opt_.drain_timeout; }

 private:
  // ---- set-up of one stage ---------------------------------------------------------------------
  Status init_stage(Stage& st) {
    const StageSpec& s = st.spec;
    if (s.name.empty()) return invalid_argument_error("a stage needs a name");
    switch (s.kind) {
      case StageKind::host:
        if (!s.host_fn) return invalid_argument_error("host stage without a function");
        if (s.concurrency < 1 || s.concurrency > 256) {
          return invalid_argument_error("concurrency must be in 1..256, got " +
                                        std::to_string(s.concurrency));
        }
        return Status();
      case StageKind::engine:
        if (s.engine == nullptr) return invalid_argument_error("engine stage without an engine");
        return Status();
      case StageKind::device:
        break;
    }
    if (!s.device) return invalid_argument_error("device stage without a device");
    if (!s.device_fn && !s.model) {
      return invalid_argument_error("device stage without a function or a model");
    }
    if (s.stream_depth < 1) return invalid_argument_error("stream_depth must be >= 1");
    StreamOptions so;
    so.host_func_executor = &dispatcher_;
    so.name = "ai-pl-" + s.name;
    ASYNCINFER_ASSIGN_OR_RETURN(st.stream, s.device->create_stream(so));
    for (std::size_t i = 0; i < opt_.window; ++i) {
      ASYNCINFER_ASSIGN_OR_RETURN(auto e, s.device->create_event(EventOptions{}));
      st.events.push_back(std::move(e));
    }
    st.unified = s.device->info().unified_memory;
    if (s.model) {
      InstanceOptions io;
      io.intra_op_threads = 1;
      ASYNCINFER_ASSIGN_OR_RETURN(st.instance, s.model->create_instance(*s.device, *st.stream, io));
    }
    return Status();
  }

  // ---- moving items between stages ---------------------------------------------------------

  void push(Stage& st, const ItemPtr& item) {
    {
      std::lock_guard lock(st.mu);
      item->stage_enter = Clock::now();
      item->at_stage.store(st.index);
      st.queue.emplace(std::make_pair(item->level, item->id), item);
      item->queued_stage.store(st.index);
    }
    st.cv.notify_one();
  }

  /// Takes the highest-priority item off the stage's queue (under st.mu). The item is marked
  /// outstanding before it leaves the queue, so it is never seen as idle in between.
  ItemPtr pop(Stage& st) {
    auto it = st.queue.begin();
    ItemPtr item = std::move(it->second);
    st.queue.erase(it);
    item->outstanding.fetch_add(1);
    item->queued_stage.store(-1);
    return item;
  }

  /// After stage `st` is done with `item` (ok): on to the next stage, or the item is complete.
  void advance(Stage& st, const ItemPtr& item) {
    if (item->ended.load()) return;
    const std::size_t next = static_cast<std::size_t>(st.index) + 1;
    if (next == stages_.size()) {
      item->at_stage.store(-1);
      end(item, Outcome::completed, std::move(item->data));
    } else {
      push(*stages_[next], item);
    }
  }

  void fail(Stage& st, const ItemPtr& item, const Status& s) {
    st.failures.fetch_add(1, std::memory_order_relaxed);
    end(item, Outcome::failed,
        Status(s.code(), "stage '" + st.spec.name + "': " + std::string(s.message())));
  }

  /// Releases the stage's hold on the item.
  void done_with(const ItemPtr& item) {
    item->outstanding.fetch_sub(1);
    maybe_retire(item);
  }

  /// Blocks until the stage has an item to work on (live items only: ended ones are let go
  /// here) and records how long it waited; null when the stages stop.
  ItemPtr take(Stage& st) {
    for (;;) {
      ItemPtr item;
      {
        std::unique_lock lock(st.mu);
        st.cv.wait(lock, [&] { return stop_stages_ || !st.queue.empty(); });
        if (stop_stages_) return nullptr;
        item = pop(st);
      }
      if (item->ended.load()) {
        done_with(item);
        continue;
      }
      st.queue_us.observe(elapsed_us_since(item->stage_enter));
      return item;
    }
  }

  // ---- the stage threads ------------------------------------------------------------------------

  /// Counts one item's service time towards the stage's busy time.
  static void account(Stage& st, double seconds) {
    st.busy_s.fetch_add(seconds, std::memory_order_relaxed);
    st.service_us.observe(seconds * 1e6);
    st.items.fetch_add(1, std::memory_order_relaxed);
  }

  /// Runs a stage function with exceptions turned into a Status.
  template <class F>
  static Status guarded(F&& fn) {
    try {
      return fn();
    } catch (const std::exception& e) {
      return internal_error(std::string("threw: ") + e.what());
    } catch (...) {
      return internal_error("threw an unknown exception");
    }
  }

  void host_loop(Stage& st) {
    while (ItemPtr item = take(st)) {
      const Clock::time_point t0 = Clock::now();
      Status s = guarded([&] { return st.spec.host_fn(item->data); });
      account(st, elapsed_s_since(t0));
      if (s.ok()) {
        advance(st, item);
      } else {
        fail(st, item, s);
      }
      done_with(item);
    }
  }

  void engine_loop(Stage& st) {
    while (ItemPtr item = take(st)) {
      const Clock::time_point t0 = Clock::now();
      RequestOptions ro;
      ro.priority = std::min(item->level + 1, st.spec.engine->options().priority_levels);
      if (item->deadline != Clock::time_point::max()) ro.deadline = item->deadline;
      Stage* sp = &st;
      Future<Outputs> call = st.spec.engine->submit(std::move(item->data.tensors), ro);
      {
        // Tracked until its callback has returned: shutdown cancels what is left and waits, so
        // no engine callback runs on a destroyed pipeline.
        std::lock_guard lock(engine_mu_);
        ++engine_pending_;
        std::erase_if(engine_calls_, [](const auto& kv) { return kv.second.is_ready(); });
      }
      const std::uint64_t id = item->id;
      call.on_complete([this, sp, item, t0](const Result<Outputs>& r) {
        account(*sp, elapsed_s_since(t0));
        if (r.ok()) {
          if (!item->ended.load()) item->data.tensors = *r;
          advance(*sp, item);
        } else {
          fail(*sp, item, r.status());
        }
        done_with(item);
        std::lock_guard lock(engine_mu_);  // the last use of `this` (see shutdown)
        --engine_pending_;
        engine_cv_.notify_all();
      });
      std::lock_guard lock(engine_mu_);
      if (!call.is_ready()) engine_calls_.emplace(id, std::move(call));
    }
  }

  void device_loop(Stage& st) {
    const bool next_is_device =
        static_cast<std::size_t>(st.index) + 1 < stages_.size() &&
        stages_[static_cast<std::size_t>(st.index) + 1]->spec.kind == StageKind::device;
    for (;;) {
      ItemPtr item;
      {
        std::unique_lock lock(st.mu);
        st.cv.wait(lock, [&] {
          return stop_stages_ || (!st.queue.empty() && st.inflight < st.spec.stream_depth);
        });
        if (stop_stages_) return;
        item = pop(st);
        ++st.inflight;
      }
      if (item->ended.load()) {
        release_stream_slot(st);
        done_with(item);
        continue;
      }
      const Clock::time_point t_enq = Clock::now();
      st.queue_us.observe(detail::us_between(item->stage_enter, t_enq));
      Status s;
      if (item->ready_event != nullptr) {
        s = st.stream->wait(*item->ready_event);  // the previous device stage's point: no host wait
        item->ready_event = nullptr;
      }
      if (s.ok()) {
        s = guarded([&] {
          return st.instance ? enqueue_model(st, *item) : st.spec.device_fn(item->data, *st.stream);
        });
      }
      if (s.ok()) s = st.stream->record(*st.events[static_cast<std::size_t>(item->slot)]);
      if (!s.ok()) {
        release_stream_slot(st);
        fail(st, item, s);
        done_with(item);
        continue;
      }
      // Hand the item to the next device stage now: its stream waits on this stage's event.
      const bool handed = next_is_device && !item->model_io;
      if (handed) {
        item->ready_event = st.events[static_cast<std::size_t>(item->slot)].get();
        push(*stages_[static_cast<std::size_t>(st.index) + 1], item);
      }
      Stage* sp = &st;
      s = st.stream->launch_host_func([this, sp, item, handed, t_enq](Status hs) {
        on_device_done(*sp, item, handed, t_enq, std::move(hs));
      });
      if (!s.ok()) on_device_done(st, item, handed, t_enq, s);
    }
  }

  Status enqueue_model(Stage& st, PItem& item) {
    const ModelSignature& sig = st.spec.model->signature();
    ASYNCINFER_RETURN_IF_ERROR(validate_inputs(sig, item.data.tensors));
    auto io = std::make_shared<BatchIO>();
    io->host_inputs = item.data.tensors;
    io->batch_size = sig.batched ? item.data.tensors.at(0).dim(0) : 1;
    io->stop = item.stop.get_token();
    if (st.unified) {
      io->inputs = io->host_inputs;
    } else {
      for (const Tensor& h : io->host_inputs) {
        ASYNCINFER_ASSIGN_OR_RETURN(
            Tensor d, st.spec.device->empty(h.dtype(), h.shape(), MemoryKind::device));
        ASYNCINFER_RETURN_IF_ERROR(st.stream->copy(d, h));
        io->inputs.push_back(std::move(d));
      }
    }
    ASYNCINFER_RETURN_IF_ERROR(st.instance->enqueue(*st.stream, io));
    if (st.unified) {
      if (io->outputs.size() == sig.outputs.size()) {
        item.data.tensors = io->outputs;  // known now, valid in stream order
      } else {
        item.model_io = io;  // filled in stream order: taken at the completion point
      }
      return Status();
    }
    std::vector<Tensor> host;
    for (const Tensor& out : io->outputs) {
      ASYNCINFER_ASSIGN_OR_RETURN(
          Tensor h, st.spec.device->empty(out.dtype(), out.shape(), MemoryKind::pinned_host));
      ASYNCINFER_RETURN_IF_ERROR(st.stream->copy(h, out));
      host.push_back(std::move(h));
    }
    item.data.tensors = std::move(host);
    return Status();
  }

  void release_stream_slot(Stage& st) {
    {
      std::lock_guard lock(st.mu);
      --st.inflight;
    }
    st.cv.notify_one();
  }

  void on_device_done(Stage& st, const ItemPtr& item, bool handed, Clock::time_point t_enq,
                      Status s) {
    release_stream_slot(st);
    const Clock::time_point now = Clock::now();
    // Occupancy of the stream by this item: from when it could start (enqueued, or the previous
    // item done) to its completion point.
    const Clock::time_point start = std::max(t_enq, st.last_done);
    st.last_done = now;
    account(st, std::chrono::duration<double>(now - start).count());
    if (!s.ok()) {
      fail(st, item, s);
    } else {
      if (item->model_io) {
        if (!item->ended.load()) item->data.tensors = item->model_io->outputs;
        item->model_io.reset();
      }
      if (!handed) advance(st, item);
    }
    done_with(item);
  }

  // ---- ending and retiring ----------------------------------------------------------------

  /// Ends the item once (later calls return false).
  bool end(const ItemPtr& item, Outcome to, Result<PipelineItem> result) {
    bool ended = false;
    if (!item->ended.compare_exchange_strong(ended, true)) return false;
    if (to != Outcome::completed) item->stop.request_stop();
    TimerId t;
    {
      std::lock_guard tl(item->timer_mu);
      t = std::exchange(item->deadline_timer, TimerId{});
    }
    timer_.cancel(t);
    outcomes_.count(to);
    // An item that ends while queued leaves its queue at once.
    const int q = item->queued_stage.load();
    if (q >= 0) {
      Stage& st = *stages_[static_cast<std::size_t>(q)];
      std::lock_guard lock(st.mu);
      if (item->queued_stage.load() == q) {
        st.queue.erase(std::make_pair(item->level, item->id));
        item->queued_stage.store(-1);
      }
    }
    deliver(item, std::move(result));
    maybe_retire(item);
    return true;
  }

  void deliver(const ItemPtr& item, Result<PipelineItem>&& result) {
    latency_us_.observe(elapsed_us_since(item->submitted));
    if (!opt_.ordered) {
      item->promise.set_result(std::move(result));
      return;
    }
    if (!order_.add({}, item->seq, Ready{item, std::move(result)})) return;  // being drained
    // Deliver everything that is next in order; one thread at a time does this.
    for (;;) {
      std::vector<Ready> run = order_.take_ready({});
      if (run.empty()) return;
      for (Ready& r : run) r.item->promise.set_result(std::move(r.result));
    }
  }

  void maybe_retire(const ItemPtr& item) {
    if (!item->ended.load()) return;
    if (item->outstanding.load() > 0 || item->queued_stage.load() >= 0) return;
    if (item->retired.exchange(true)) return;
    {
      std::lock_guard lock(window_mu_);
      free_slots_.push_back(item->slot);
      --in_flight_;
      active_.erase(item->id);
    }
    window_cv_.notify_one();
    drain_cv_.notify_all();
  }

  // ---- state ------------------------------------------------------------------------------------

  PipelineOptions opt_;
  ThreadPool completion_;
  ThreadPool dispatcher_;
  DeadlineTimer timer_;
  std::vector<std::unique_ptr<Stage>> stages_;

  mutable std::mutex window_mu_;
  std::condition_variable window_cv_;
  std::condition_variable drain_cv_;
  std::vector<int> free_slots_;
  std::int64_t in_flight_ = 0;
  std::int64_t max_in_flight_ = 0;
  bool stopping_ = false;
  bool cut_drain_ = false;  ///< a cancel came during a drain (under window_mu_)
  std::optional<Clock::time_point> first_submit_;
  std::unordered_map<std::uint64_t, ItemPtr> active_;  // by PItem::id
  std::uint64_t next_id_ = 0;                          // under window_mu_
  std::atomic<bool> stop_stages_{false};

  std::mutex engine_mu_;
  std::condition_variable engine_cv_;
  std::int64_t engine_pending_ = 0;                                  // under engine_mu_
  std::unordered_map<std::uint64_t, Future<Outputs>> engine_calls_;  // under engine_mu_

  detail::OrderedDelivery<Ready> order_;  // numbers items (seq); delivers them in that order

  std::atomic<std::uint64_t> submitted_{0};
  detail::OutcomeCounters outcomes_;
  Histogram latency_us_;

  std::mutex shutdown_mu_;
  bool shut_ = false;
};

// ---- Pipeline -----------------------------------------------------------------------------------

Result<std::unique_ptr<Pipeline>> Pipeline::create(std::vector<StageSpec> stages,
                                                   PipelineOptions options) {
  if (stages.empty()) return invalid_argument_error("Pipeline::create: no stages");
  if (options.window < 1) return invalid_argument_error("PipelineOptions: window must be >= 1");
  if (options.priority_levels < 1 || options.default_priority < 1 ||
      options.default_priority > options.priority_levels) {
    return invalid_argument_error(
        "PipelineOptions: priority_levels must be >= 1 and default_priority in 1..priority_levels");
  }
  if (options.completion_threads < 1) {
    return invalid_argument_error("PipelineOptions: completion_threads must be >= 1");
  }
  auto core = std::make_shared<PipelineCore>(options);
  Status s = core->init(std::move(stages));
  if (!s.ok()) {
    core->shutdown(ShutdownMode::cancel, std::chrono::milliseconds(0));
    return s.with_context("Pipeline::create");
  }
  return std::unique_ptr<Pipeline>(new Pipeline(std::move(core)));
}

Pipeline::Pipeline(std::shared_ptr<PipelineCore> core) : core_(std::move(core)) {}

Pipeline::~Pipeline() {
  if (core_) core_->shutdown(ShutdownMode::drain, core_->drain_timeout());
}

Future<PipelineItem> Pipeline::submit(PipelineItem item, const ItemOptions& options) {
  return core_->submit(std::move(item), options);
}

std::vector<Result<PipelineItem>> Pipeline::run(std::vector<PipelineItem> items,
                                                const ItemOptions& options) {
  std::vector<Future<PipelineItem>> futures;
  futures.reserve(items.size());
  for (auto& item : items) futures.push_back(core_->submit(std::move(item), options));
  std::vector<Result<PipelineItem>> results;
  results.reserve(futures.size());
  for (auto& f : futures) results.push_back(f.get());
  return results;
}

void Pipeline::shutdown(ShutdownMode mode) { core_->shutdown(mode, core_->drain_timeout()); }

PipelineMetrics Pipeline::metrics() const { return core_->metrics(); }

}  // namespace asyncinfer
