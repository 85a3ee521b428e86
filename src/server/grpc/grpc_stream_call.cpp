// ModelStreamInfer's reactor (StreamCall): Triton's bidirectional stream of inference requests,
// read one after another while earlier ones run, each answered when it completes (grpc_server.hpp
// has the design; the locking rule is on the class).
//
// A client that stops reading holds a write for ever (HTTP/2 flow control), and with it the
// stream's requests: a decoupled model waits for room (back-pressure) on its worker. The write
// watchdog ends that: a write pending longer than GrpcOptions::stream_stall_timeout (the serve
// command's --idle-timeout) cancels the stream as a client's cancel would (its requests are
// cancelled, the worker freed) and resets the HTTP/2 stream; the metrics count it
// (asyncinfer_grpc_stalled_streams_total). One timer per stream at most, armed when a write
// starts with none armed, and re-armed when it fires at the deadline of the write pending then
// (a moving deadline, as the HTTP session's), so that a steady reader costs no timer per write.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grpc_server_impl.hpp"
#include "grpc_stream_state.hpp"
#include "oip_grpc.hpp"
#include "trace.hpp"

namespace asyncinfer::server {
namespace {

/// ModelStreamInfer: reads requests one after another while earlier ones run, writes each
/// response when its request completes (completion order), one write at a time.
///
/// Where the call is — its read side (read_) and its end (end_) — changes through set_read() and
/// set_end() only, checked against the tables of grpc_stream_state.hpp.
///
/// All state is under mu_; library operations (StartRead, StartWrite, Finish) are started after
/// mu_ is released, in that order (a read is started before a write, and both before Finish, so
/// the call cannot end while one is being started), because a reaction may run inline in them.
class StreamCall final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                         public Call {
 public:
  StreamCall(GrpcServer::Impl& impl, grpc::CallbackServerContext* ctx)
      : Call(1),
        impl_(impl),
        ctx_(ctx),
        deadline_(call_deadline(ctx)),
        account_(*impl.acceptor, ctx),
        queued_lease_(impl.core.memory().lease()) {
    impl_.add(this);
    Actions a;
    {
      std::lock_guard lock(mu_);
      if (impl_.draining()) set_end(StreamEnd::draining);
      a = next_locked();
    }
    run(a);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed (or the call ended).
      Actions a;
      {
        std::lock_guard lock(mu_);
        set_read(StreamRead::ended);
        a = next_locked();
      }
      return run(a);
    }
    {
      std::lock_guard lock(mu_);
      if (end_ == StreamEnd::finished) {  // ended (drained or cancelled) meanwhile: dropped
        set_read(StreamRead::idle);
        return;
      }
    }
    const std::uint64_t index = received_++;
    ParsedInfer message =
        parse_infer_request(read_buf_, impl_.core, "stream message " + std::to_string(index + 1));
    if (!message.well_formed) {
      const Status& parsed = message.status;
      // Garbage: stop reading; answer what was accepted, then end the stream with the error.
      Actions a;
      {
        std::lock_guard lock(mu_);
        set_read(StreamRead::stopped);
        if (end_status_.ok()) end_status_ = parsed;
        a = next_locked();
      }
      impl_.count(grpc_code(parsed.code()));
      return run(a);
    }
    handle(std::move(message));
    Actions a;
    {
      std::lock_guard lock(mu_);
      set_read(StreamRead::idle);
      a = next_locked();
    }
    run(a);
  }

  void OnWriteDone(bool ok) override {
    Actions a;
    {
      std::lock_guard lock(mu_);
      writing_ = false;
      queued_lease_.hold(queued_lease_.bytes() - queue_.front().Length());
      queue_.pop_front();
      room_.notify_all();
      if (!ok) {
        // The client is gone: nothing more can be written.
        if (!cut_off_locked()) set_end(StreamEnd::broken);
        drop_queued_locked();
      }
      a = next_locked();
    }
    if (!ok) cancel_inflight();
    run(a);
  }

  void OnCancel() override {
    // The server's own cancel of a stalled stream is not the client's reset.
    if (!stalled_.load(std::memory_order_acquire)) account_.cancelled();
    {
      std::lock_guard lock(mu_);
      // Once cut off (a failed write) or finished, a cancel changes nothing more.
      if (end_ == StreamEnd::open || end_ == StreamEnd::draining) set_end(StreamEnd::cancelled);
      drop_queued_locked();
    }
    cancel_inflight();
    Actions a;
    {
      std::lock_guard lock(mu_);
      a = next_locked();
    }
    run(a);
  }

  void OnDone() override {
    {
      std::lock_guard lock(ctx_mu_);
      done_ = true;
    }
    TimerId watchdog;
    {
      std::lock_guard lock(mu_);
      watchdog = std::exchange(watchdog_, TimerId());
    }
    // A timer disarmed here will not run: its reference is dropped with its function.
    if (watchdog) impl_.stall_timer.cancel(watchdog);
    // Everything before Finish happened under mu_: taking it orders the destructor after it for
    // ThreadSanitizer as well (gRPC's own synchronization is not instrumented).
    { std::lock_guard lock(mu_); }
    account_.ended();
    impl_.remove(this);
    release();
  }

  void on_drain() override {
    Actions a;
    {
      std::lock_guard lock(mu_);
      if (end_ == StreamEnd::open) set_end(StreamEnd::draining);  // else it ends anyway
      a = next_locked();
    }
    run(a);
  }

  void on_stop() override {
    // TryCancel may run OnCancel inline (which takes mu_, not ctx_mu_); OnDone runs on another
    // thread and waits here, so ctx_ is valid throughout.
    std::lock_guard lock(ctx_mu_);
    if (!done_) ctx_->TryCancel();
  }

 private:
  struct Actions {
    bool read = false;
    grpc::ByteBuffer* write = nullptr;
    std::optional<grpc::Status> finish;
    /// Arm the write watchdog for this time (next_locked() marked it armed).
    std::optional<Clock::time_point> watch;
  };

  /// The write watchdog fired (on the stall timer's thread): a write pending since before
  /// `stall_timeout` ago cancels the stream; one pending for less re-arms it at its deadline;
  /// none pending leaves it disarmed (the next write arms it).
  void on_watchdog() {
    const auto timeout = impl_.opt.stream_stall_timeout;
    std::optional<Clock::time_point> again;
    bool stalled = false;
    {
      std::lock_guard lock(mu_);
      watchdog_ = TimerId();
      if (end_ == StreamEnd::finished || cut_off_locked() || !writing_) {
        watchdog_armed_ = false;  // the next write arms it
        return;
      }
      const Clock::time_point due = write_started_ + timeout;
      if (Clock::now() < due) {
        again = due;
      } else {
        // As a client's cancel: nothing more is written, what runs is cancelled.
        watchdog_armed_ = false;
        stalled = true;
        stalled_.store(true, std::memory_order_release);
        set_end(StreamEnd::cancelled);
        drop_queued_locked();
      }
    }
    if (again) return arm_watchdog(*again);
    if (!stalled) return;
    impl_.metrics.stream_stalled();
    cancel_inflight();
    // Resets the HTTP/2 stream: the pending write ends (ok = false), then Finish, then OnDone.
    on_stop();
    Actions a;
    {
      std::lock_guard lock(mu_);
      a = next_locked();
    }
    run(a);
  }

  /// Arms the watchdog at `when`; the timer holds a reference to this call until its function
  /// has run or is destroyed unrun (cancelled by OnDone, or the timer shut down).
  void arm_watchdog(Clock::time_point when) {
    ref();
    std::shared_ptr<StreamCall> hold(this, [](StreamCall* c) { c->release(); });
    std::lock_guard lock(mu_);
    if (end_ == StreamEnd::finished) {
      watchdog_armed_ = false;
      return;  // `hold` lets go
    }
    watchdog_ = impl_.stall_timer.add(when, [hold = std::move(hold)] { hold->on_watchdog(); });
  }

  void handle(ParsedInfer message) {
    const Clock::time_point start = Clock::now();
    auto fail = [&](const Status& s) {
      impl_.count(grpc_code(s.code()));
      enqueue(encode_stream_error(s, message.model_name, message.model_version, message.id));
    };
    if (!message.status.ok()) return fail(message.status);
    ModelRef mv = message.model;
    message.request.deadline = deadline_;
    impl_.forward_headers(ctx_, message.request.parameters);
    if (impl_.core.tracer().active()) [[unlikely]] {  // Triton's trace extension (trace.hpp)
      std::optional<TraceParent> parent;
      const auto& md = ctx_->client_metadata();
      if (auto it = md.find("traceparent"); it != md.end()) {
        parent = parse_traceparent(std::string_view(it->second.data(), it->second.size()));
      }
      // Each request of the stream is a trace of its own, as Triton's stream handler makes one.
      if (auto trace = impl_.core.tracer().sample(mv->model_name, parent)) {
        trace->record("GRPC_WAITREAD_START", trace_ns(start));
        trace->record_now("GRPC_WAITREAD_END");
        message.request.trace = std::move(trace);
      }
    }
    // The request's tensors count against the server's memory budget while it runs.
    MemoryBudget::Lease lease = impl_.core.memory().lease();
    if (const std::size_t bytes = input_bytes(message.request); !lease.reserve(bytes)) {
      return fail(resource_exhausted_error(impl_.core.memory().exhausted_message(bytes)));
    }
    // A decoupled model's responses (Triton's stream_infer_handler): each carries
    // triton_final_response; the final flag alone is sent only when the client asked for it.
    const bool decoupled = mv->signature.decoupled;
    bool empty_final = false;
    if (decoupled) {
      if (auto it = message.request.parameters.find("triton_enable_empty_final_response");
          it != message.request.parameters.end()) {
        auto b = parameter_bool(it->second, "triton_enable_empty_final_response");
        if (!b.ok()) return fail(b.status());
        empty_final = *b;
      }
      // `this` outlives the call: the request is in inflight_ until complete(), which the
      // engine runs only after on_response has returned (RequestOptions::on_response).
      message.request.on_response = [this, mv, id = message.id](InferResponse r,
                                                                std::stop_token stop) {
        return send_response(*mv, id, r, stop);
      };
    }
    std::uint64_t seq = 0;
    {
      // The gate: once the request is in inflight_ the stream cannot finish until it completes.
      std::lock_guard lock(mu_);
      if (end_ == StreamEnd::finished || cut_off_locked()) return;
      seq = next_seq_++;
      inflight_.emplace(seq, Running{InflightRequest(), std::move(lease)});
    }
    const std::optional<bool> final_flag =
        decoupled ? std::optional<bool>(empty_final) : std::nullopt;
    auto accepted = impl_.core.submit(
        mv, std::move(message.request),
        [this, seq, start, mv, id = message.id, final_flag](Result<InferResponse> r) mutable {
          complete(seq, start, *mv, id, final_flag, std::move(r));
        });
    if (!accepted.ok()) {
      {
        std::lock_guard lock(mu_);
        inflight_.erase(seq);
      }
      return fail(accepted.status());
    }
    InflightRequest cancel_now;
    {
      std::lock_guard lock(mu_);
      auto it = inflight_.find(seq);
      if (it != inflight_.end()) {  // else it has completed already
        if (cut_off_locked()) {
          cancel_now = std::move(*accepted);
        } else {
          it->second.request = std::move(*accepted);
        }
      }
    }
    cancel_now.cancel();
  }

  /// A decoupled model's response before its final one, on the model's thread. Back-pressure:
  /// waits while max_stream_inflight responses of this stream are waiting to be written (so a
  /// client that reads slowly slows its model down, and the server's memory stays bounded).
  /// cancelled once the stream is gone or the request has ended (`stop`): the model stops
  /// sending for this request.
  Status send_response(const ModelVersion& mv, const std::string& id, const InferResponse& r,
                       const std::stop_token& stop) {
    grpc::ByteBuffer out = encode_infer_response(r, true, false);
    Status too_big = check_response_size(out, impl_.opt.max_message_bytes);
    if (!too_big.ok()) out = encode_stream_error(too_big, mv.model_name, mv.version_text, id);
    Actions a;
    {
      std::unique_lock lock(mu_);
      room_.wait(lock, stop, [&] {
        return cut_off_locked() || end_ == StreamEnd::finished ||
               queue_.size() < impl_.opt.max_stream_inflight;
      });
      if (cut_off_locked() || end_ == StreamEnd::finished || stop.stop_requested()) {
        return cancelled_error("the stream of request '" + id + "' has ended");
      }
      push_locked(std::move(out));
      a = next_locked();
    }
    run(a);
    return too_big;
  }

  /// On the engine's completion executor. `final_flag`: set for a decoupled model, whether the
  /// client asked for an empty final response (triton_enable_empty_final_response).
  void complete(std::uint64_t seq, Clock::time_point start, const ModelVersion& mv,
                const std::string& id, std::optional<bool> final_flag, Result<InferResponse> r) {
    grpc::ByteBuffer out;
    Status status = r.ok() ? Status() : r.status();
    // A decoupled model's final flag without a response is written only when asked for.
    const bool write = !r.ok() || !final_flag || *final_flag || !r->outputs.empty();
    // A traced request's send: from its encoding until its answer is queued on the stream
    // (the stream's writes are not told apart per request).
    std::shared_ptr<Trace> trace = r.ok() ? std::move(r->trace) : nullptr;
    if (trace) [[unlikely]]
      trace->record_now("GRPC_SEND_START");
    if (r.ok() && write) {
      out = encode_infer_response(*r, true, final_flag ? std::optional<bool>(true) : std::nullopt);
      status = check_response_size(out, impl_.opt.max_message_bytes);
    }
    // A failed request is answered on the stream with error_message; the stream goes on.
    if (!status.ok()) {
      out = encode_stream_error(status, mv.model_name, mv.version_text, id);
      // An id too long to echo in the error (the rest of the request was large too) is left out
      // rather than end the stream.
      if (!check_response_size(out, impl_.opt.max_message_bytes).ok()) {
        out = encode_stream_error(status, mv.model_name, mv.version_text, "");
      }
    }
    impl_.count(grpc_code(status.code()));
    impl_.metrics.observe_infer_us(micros_since(start));
    Actions a;
    {
      std::lock_guard lock(mu_);
      inflight_.erase(seq);
      if (!cut_off_locked() && (write || !status.ok())) push_locked(std::move(out));
      a = next_locked();
    }
    if (trace) [[unlikely]]
      trace->record_now("GRPC_SEND_END");
    run(a);
  }

  void enqueue(grpc::ByteBuffer out) {
    std::lock_guard lock(mu_);
    if (!cut_off_locked() && end_ != StreamEnd::finished) push_locked(std::move(out));
    // The caller (OnReadDone) computes the next actions.
  }

  /// Drops the responses not yet written; the one being written stays until OnWriteDone.
  void drop_queued_locked() {
    room_.notify_all();  // a model waiting to send finds the stream gone
    if (writing_) {
      queue_.erase(queue_.begin() + 1, queue_.end());
    } else {
      queue_.clear();
    }
    count_queued_locked();
  }

  /// Responses waiting to be written count against the server's memory budget (a client that
  /// reads slowly holds them).
  void push_locked(grpc::ByteBuffer out) {
    queued_lease_.hold(queued_lease_.bytes() + out.Length());
    queue_.push_back(std::move(out));
  }
  void count_queued_locked() {
    std::size_t bytes = 0;
    for (const grpc::ByteBuffer& b : queue_) bytes += b.Length();
    queued_lease_.hold(bytes);
  }

  void cancel_inflight() {
    std::vector<InflightRequest> cancel;
    {
      std::lock_guard lock(mu_);
      for (auto& [seq, running] : inflight_) {
        if (running.request.valid()) cancel.push_back(std::move(running.request));
      }
    }
    for (InflightRequest& f : cancel) f.cancel();
  }

  /// What to start next; marks it started.
  Actions next_locked() {
    Actions a;
    if (end_ == StreamEnd::finished) return a;
    const bool ending =
        end_ != StreamEnd::open || read_ == StreamRead::ended || read_ == StreamRead::stopped;
    if (read_ == StreamRead::idle && !ending &&
        inflight_.size() + queue_.size() < impl_.opt.max_stream_inflight) {
      set_read(StreamRead::reading);
      a.read = true;
    }
    if (!writing_ && !queue_.empty() && !cut_off_locked()) {
      writing_ = true;
      a.write = &queue_.front();
      write_started_ = Clock::now();
      if (!watchdog_armed_ && impl_.opt.stream_stall_timeout.count() > 0) {
        watchdog_armed_ = true;
        a.watch = write_started_ + impl_.opt.stream_stall_timeout;
      }
    }
    // End once nothing is running or waiting to be written; a read may still be pending when the
    // stream is cancelled or drained (it then completes with ok = false).
    if (ending && !a.read && !writing_ && queue_.empty() && inflight_.empty() &&
        (read_ != StreamRead::reading || end_ != StreamEnd::open)) {
      if (cut_off_locked()) {
        a.finish = grpc::Status(grpc::StatusCode::CANCELLED, "the stream was cancelled");
      } else if (!end_status_.ok()) {
        a.finish = to_grpc(end_status_);
      } else if (end_ == StreamEnd::draining && read_ != StreamRead::ended) {
        a.finish = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                "server is shutting down; the requests of this stream that were "
                                "accepted have been answered, reopen the stream elsewhere");
      } else {
        a.finish = grpc::Status::OK;
      }
      set_end(StreamEnd::finished);
    }
    return a;
  }

  /// The one place read_ changes (under mu_): checked against kStreamReadMoves.
  void set_read(StreamRead to) { kStreamReadMoves.move(read_, to); }
  /// The one place end_ changes (under mu_): checked against kStreamEndMoves.
  void set_end(StreamEnd to) { kStreamEndMoves.move(end_, to); }
  /// Cancelled or broken: nothing more is written, what runs is cancelled (under mu_).
  bool cut_off_locked() const { return end_ == StreamEnd::cancelled || end_ == StreamEnd::broken; }

  void run(Actions& a) {
    if (a.watch) arm_watchdog(*a.watch);
    if (a.read) StartRead(&read_buf_);
    if (a.write != nullptr) StartWrite(a.write);
    if (a.finish) {
      account_.finished();
      Finish(std::move(*a.finish));
    }
  }

  GrpcServer::Impl& impl_;
  grpc::CallbackServerContext* ctx_;
  const std::optional<Clock::time_point> deadline_;
  AcceptorAccount account_;
  grpc::ByteBuffer read_buf_;  // only the read path touches it
  std::uint64_t received_ = 0;

  std::mutex mu_;
  /// Signalled when queue_ shrinks or the stream ends (send_response's back-pressure).
  std::condition_variable_any room_;
  /// A request of the stream in the engine, and its share of the server's memory budget.
  struct Running {
    InflightRequest request;
    MemoryBudget::Lease lease;
  };
  std::unordered_map<std::uint64_t, Running> inflight_;
  MemoryBudget::Lease queued_lease_;    ///< the responses in queue_
  std::deque<grpc::ByteBuffer> queue_;  // front() is being written while writing_
  std::uint64_t next_seq_ = 0;
  Status end_status_;
  StreamRead read_ = StreamRead::idle;  ///< changed by set_read() only
  StreamEnd end_ = StreamEnd::open;     ///< changed by set_end() only
  /// A write is pending (queue_.front()). An outstanding operation beside the states above, not
  /// a state of its own: a write may be pending in every end state before finished.
  bool writing_ = false;
  /// When the pending write started (the write watchdog's measure of progress).
  Clock::time_point write_started_;
  /// The write watchdog: armed (a timer is pending or its function runs; cleared when it finds
  /// no write pending) and the pending timer's id (OnDone disarms it).
  bool watchdog_armed_ = false;
  TimerId watchdog_;
  /// The watchdog cancelled the stream (OnCancel then counts no client reset).
  std::atomic<bool> stalled_{false};

  std::mutex ctx_mu_;
  /// OnDone has run: ctx_ is gone (under ctx_mu_, not mu_, so it cannot join the states above;
  /// on_stop() reads it).
  bool done_ = false;
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* new_stream_call(
    GrpcServer::Impl& impl, grpc::CallbackServerContext* ctx) {
  return new StreamCall(impl, ctx);
}

}  // namespace asyncinfer::server
