// python_process.hpp (internal) — one Python process that runs one instance of a Triton
// model.py: its start, the control channel, the shared-memory arenas, and its end.
//
// Design (after Triton's Python backend, which runs each instance in its own stub process so that
// one interpreter's GIL does not serialise the server's models, and a model.py that crashes, leaks
// or hangs takes only its own process down):
//   - the process is <interpreter> -c <bootstrap>, in its own process group (a terminal's Ctrl-C
//     reaches the server, which then shuts its models down in order). It dies with the server:
//     fd 4 is the read end of a pipe only the server holds the write end of, and the stub's
//     watcher thread kills its process group when that pipe reaches EOF. The server watches the
//     process through a pidfd, so an exit is seen even when a child of model.py still holds the
//     socket;
//   - control: a SOCK_SEQPACKET socketpair (message boundaries kept), one JSON object per message
//     (asyncinfer_python_stub.py documents the protocol);
//   - tensors: memfd regions mapped by both processes, the input arena (this side writes and
//     grows it) and the output arena (the stub writes and grows it), a pair for each of two slots
//     (two batches in flight: post()); a grown one's descriptor is passed with SCM_RIGHTS. Both are
//     sealed against shrinking and growing (F_SEAL_SHRINK, F_SEAL_GROW), so that model.py cannot
//     truncate one under the server's feet (a SIGBUS in the server); an output arena without those
//     seals is refused. One copy in, one copy out, whatever the tensors' size.
//
// Thread safety: none, but for post(): the instance that owns a PythonProcess uses it from one
// thread at a time (its stream's host function), and may post() the next batch from another
// thread meanwhile, under a lock of its own that also covers execute()'s sending of a batch
// (python_model.cpp's Slot).
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <vector>

#include "asyncinfer/model.hpp"
#include "model/model_host.hpp"

namespace asyncinfer::detail {

/// What every instance of one python model shares.
struct PythonSetup {
  std::string uri;          ///< the model's name (its URI)
  std::string model_py;     ///< absolute path of model.py
  std::string interpreter;  ///< e.g. /usr/bin/python3
  std::string model_name;   ///< args["model_name"]
  std::string model_version;
  std::string model_repository;  ///< args["model_repository"]: the model's folder
  std::string config_json;       ///< args["model_config"]
  ModelSignature signature;
  /// How long initialize() may take before the load fails.
  std::chrono::milliseconds initialize_timeout{120'000};
  /// How long an execute may go on once every request of its batch has ended (cancelled, timed
  /// out, its client gone) or its stream is being replaced, before the process is killed and
  /// restarted at the next batch. Also how long finalize() may take.
  std::chrono::milliseconds stop_grace{2'000};
  /// Two batches in flight per process (python_model.cpp's Slot): neither decoupled (a decoupled
  /// model's responses use one output arena), nor stateful (sequence_batching), nor dynamically
  /// batched (the requests that come while a batch runs make the next one).
  bool pipelined = false;
  /// The server the model runs in (ModelOptions::host): model.py's business logic scripting,
  /// model loading API and custom metrics; null = none (those calls fail with unavailable).
  std::shared_ptr<ModelHostLink> host;
};

class PythonProcess {
 public:
  /// Starts the process and runs model.py's initialize(args). Blocks until initialize returns.
  /// unavailable with the traceback's last line when initialize (or the import of model.py)
  /// raises, or the process exits or does not answer within initialize_timeout; cancelled at
  /// once when `stop` (if given) fires. The process is then killed and gone.
  /// `stop_bounds_initialize`: the caller bounds initialize with `stop` (a model server's load
  /// deadline), so PythonSetup::initialize_timeout does not apply.
  static Result<std::unique_ptr<PythonProcess>> start(std::shared_ptr<const PythonSetup> setup,
                                                      std::string instance_name,
                                                      const std::stop_token* stop = nullptr,
                                                      bool stop_bounds_initialize = false);
  /// Triton's auto-complete: runs model.py's TritonPythonModel.auto_complete_config on
  /// `config_json` (a ModelConfig in protobuf's JSON form) in a process of its own, which then
  /// exits, and returns the config it returned, as JSON. invalid_argument with model.py's message
  /// when it raises (Triton's errors for a config it contradicts), unavailable when the process
  /// fails or takes over PythonSetup::initialize_timeout. Blocks.
  static Result<std::string> auto_complete(std::shared_ptr<const PythonSetup> setup,
                                           const std::string& config_json);
  /// Asks model.py to finalize() (up to stop_grace) unless the process is stuck, then kills it
  /// and reaps it.
  ~PythonProcess();
  PythonProcess(const PythonProcess&) = delete;
  PythonProcess& operator=(const PythonProcess&) = delete;

  /// Runs one batch: writes its inputs to the input arena, hands the stub its requests (one per
  /// io.request_rows entry), serves the stub's sends and questions until it is done, and fills
  /// io.outputs (not decoupled) or sends through io.responses (decoupled). Blocks; `stop` ends it
  /// early (after PythonSetup::stop_grace). Errors name the model; after an error that leaves the
  /// process unusable (it exited, was killed, broke the protocol) alive() is false.
  /// While it runs, model.py's requests to other models (business logic scripting) go to
  /// PythonSetup::host, carrying the batch's deadline and chain of callers; their responses are
  /// sent to the stub as they come (docs/design.md, "Business logic scripting"); those still in
  /// flight when it returns are cancelled.
  /// `slot` (0 or 1): the input and output arenas the batch uses. `posted`: post(io, slot) has
  /// already sent it; otherwise it is sent now.
  Status execute(BatchIO& io, const std::stop_token& stop, int slot = 0, bool posted = false);
  /// Sends a batch ahead: its inputs to the input arena of `slot` and the stub its requests, so
  /// that the stub starts it as soon as it is done with the batch it runs, without waiting for
  /// this side; execute(io, stop, slot, true) later carries the conversation on. The caller sends
  /// batches in the order their execute()s run, at most two unfinished at once, and a slot only
  /// once the execute() of its previous batch has returned (its outputs are copied out). May run
  /// on another thread than an execute() of an earlier batch (it touches only the slot's input
  /// arena and the socket's send side). Not for a decoupled model (its sends use slot 0's output
  /// arena). An error leaves the batch unsent: unavailable when the process is gone or the send
  /// failed (the process must be replaced; the next execute() finds out), another code when
  /// nothing was sent (the arena cannot grow), the process as it was.
  Status post(const BatchIO& io, int slot);

  bool alive() const noexcept { return pid_ > 0 && !broken_.load(std::memory_order_acquire); }
  /// Whether the process has exited (or was killed) since the last batch; never blocks.
  bool exited() const noexcept;
  pid_t pid() const noexcept { return pid_; }

 private:
  struct Message;
  struct Mailbox;
  PythonProcess(std::shared_ptr<const PythonSetup> setup, std::string instance_name)
      : setup_(std::move(setup)), instance_name_(std::move(instance_name)) {}

  Status spawn(const std::stop_token* stop, bool stop_bounds_initialize);
  Status send_message(const std::string& text, int fd = -1);
  /// The next message. `stop` (may be null) starts the grace period (`grace`, default
  /// PythonSetup::stop_grace; once per batch: the messages that come meanwhile do not renew it);
  /// `deadline` bounds the wait.
  Result<Message> receive(const std::stop_token* stop,
                          std::chrono::steady_clock::time_point deadline,
                          std::optional<std::chrono::milliseconds> grace = std::nullopt);
  /// One message from the socket without waiting: a body that is no object when none is there
  /// yet; errors as receive()'s.
  Result<Message> read_message();
  /// execute() after its checks: the conversation (nlohmann's exceptions pass through).
  Status execute_messages(BatchIO& io, const std::stop_token& stop, bool posted);
  /// The output arena of the batch being executed.
  std::string_view output_bytes() const;
  /// Marks the process unusable, kills it and describes how it ended ("exited with status 1",
  /// "killed by signal 11 (SIGSEGV)").
  std::string kill_and_reap();
  std::string exit_description();
  Status fail(StatusCode code, const std::string& what);
  /// The batch's inputs into the input arena of `slot` (grown if needed: *new_arena) and its
  /// execute message (*message). The requests' description goes into the arena too, after the
  /// tensors, when the message would otherwise pass the socket's limit (a request's parameters
  /// may be any size): the message then says where it is.
  Status write_inputs(const BatchIO& io, int slot, std::string* message, bool* new_arena);
  Status map_output_arena(const Message& m);
  /// Copies a response's tensors out of `bytes` (the output arena, or a message's inline
  /// payload), checked against the signature for a request of `rows` rows (batched) or the full
  /// shapes (not batched).
  Result<std::vector<Tensor>> read_outputs(const void* specs, std::int64_t rows,
                                           std::size_t request, std::string_view bytes);
  /// A message the stub may send in any phase (init, execute, finalize) that asks something of
  /// the server (PythonSetup::host) or logs: handled (answered now, or later through the
  /// mailbox) and *handled set; anything else is left to the caller. Errors break the channel.
  Status handle_host_message(Message& m, bool* handled);
  /// infer: model.py's request to another model.
  Status start_call(Message& m, std::uint64_t tag);
  /// Sends the stub what other threads left in the mailbox (responses to its calls).
  Status flush_mail();
  /// Cancels this batch's calls still in flight (their late responses are dropped by the stub).
  void end_calls();

  std::shared_ptr<const PythonSetup> setup_;
  std::string instance_name_;
  pid_t pid_ = -1;
  int sock_ = -1;
  int wake_ = -1;          // eventfd: a stop callback writes it to wake receive()
  int pidfd_ = -1;         // readable once the process has exited
  int life_ = -1;          // write end of the pipe whose EOF tells the stub the server is gone
  bool stopping_ = false;  // the current batch's stop has fired: the grace period runs
  std::chrono::steady_clock::time_point grace_end_ = std::chrono::steady_clock::time_point::max();
  std::string buffer_;               // receive()'s, kept between messages
  std::atomic<bool> broken_{false};  // read by post() on another thread
  int status_ = 0;                   // waitpid status once reaped
  bool reaped_ = false;
  // The input arenas, one a slot (this side owns them).
  struct InputArena {
    int fd = -1;
    void* map = nullptr;
    std::size_t size = 0;
  };
  std::array<InputArena, 2> in_{};
  // Business logic scripting: the batch being executed (its deadline and callers; null outside
  // execute), its calls in flight by the stub's tag, and where their responses wait to be sent.
  const BatchIO* io_ = nullptr;
  std::map<std::uint64_t, std::shared_ptr<HostCall>> calls_;
  // A decoupled model's posted sends (no answer awaited): the first that failed, told to
  // model.py in the answer to its next answered send, then cleared. Per batch.
  std::string posted_send_error_;
  std::shared_ptr<Mailbox> mail_;
  // auto_complete(): the config sent in place of init, and the one model.py returned.
  std::string auto_complete_in_;
  std::string auto_complete_out_;
  // The output arenas, one a slot (the stub's; mapped read-only here), and the slot of the batch
  // being executed.
  struct OutputArena {
    void* map = nullptr;
    std::size_t size = 0;
  };
  std::array<OutputArena, 2> out_{};
  int slot_ = 0;
};

}  // namespace asyncinfer::detail
