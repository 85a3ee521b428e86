// PythonProcess (python_process.hpp): the server's side of one Python stub process.
//
// One file of about 1,100 lines, on purpose: it implements one class whose parts all work on the
// same process state (the socket, pidfd and eventfd, the two arenas, the mailbox, and the broken_,
// reaped_, stopping_ and grace_end_ fields) through send_message(), receive() and
// kill_and_reap(), which start, execute and the destructor all use. It is also the server's half
// of one protocol whose other half is asyncinfer_python_stub.py: every message of it is handled
// here, in one file to read beside that one.
// Its sections, in order: helpers (constants, datatype names, TritonError codes, Fds), the
// mailbox (responses to model.py's calls), start (spawn and the init handshake), end (destructor,
// exited), control messages (send_message, receive, exit_description, kill_and_reap), arenas
// (write_inputs, map_output_arena, read_outputs), execute (execute, execute_messages), and the
// calls model.py makes (handle_host_message, start_call, flush_mail).
#include "model/python/python_process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "asyncinfer/log.hpp"

extern char** environ;  // NOLINT(readability-redundant-declaration): posix_spawn's environment

namespace asyncinfer::detail {

extern const std::string_view kPythonStubSource;   // asyncinfer_python_stub.py (generated)
extern const std::string_view kPythonUtilsSource;  // triton_python_backend_utils.py (generated)

// ---- helpers ------------------------------------------------------------------------------------

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Runs the stub's text, which arrives as the first message on fd 3 (python_process.hpp).
constexpr const char* kBootstrap =
    "import socket\n"
    "_asyncinfer_sock = socket.socket(fileno=3)\n"
    "exec(compile(_asyncinfer_sock.recv(1 << 20).decode(), 'asyncinfer_python_stub.py', "
    "'exec'))\n";

// A SOCK_SEQPACKET message must fit the socket's send buffer (wmem_default, 208 KiB on Debian);
// the stub clips its error texts so that its messages stay well below this.
constexpr std::size_t kMaxMessage = 160 * 1024;
constexpr std::size_t kAlign = 64;
constexpr std::size_t kMinArena = 1 << 20;
constexpr auto kExitWait = std::chrono::seconds(2);

std::string errno_text(int e) { return std::strerror(e); }

std::size_t align_up(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// The protocol's datatype names, as the stub reads them (parse_dtype reads them back).
constexpr std::pair<std::string_view, DType> kDatatypes[] = {
    {"FP32", DType::f32},   {"FP16", DType::f16},   {"FP64", DType::f64},
    {"INT8", DType::i8},    {"UINT8", DType::u8},   {"INT16", DType::i16},
    {"UINT16", DType::u16}, {"INT32", DType::i32},  {"UINT32", DType::u32},
    {"INT64", DType::i64},  {"UINT64", DType::u64}, {"BOOL", DType::boolean},
    {"BF16", DType::bf16},  {"BYTES", DType::bytes}};

std::string_view datatype_name(DType d) {
  for (const auto& [name, dtype] : kDatatypes) {
    if (dtype == d) return name;
  }
  return "?";
}

// pb_utils.TritonError's codes -> ours.
StatusCode code_of_triton_error(int code) {
  switch (code) {
    case 2:
      return StatusCode::not_found;
    case 3:
      return StatusCode::invalid_argument;
    case 4:
      return StatusCode::unavailable;
    case 5:
      return StatusCode::failed_precondition;  // UNSUPPORTED
    case 6:
      return StatusCode::already_exists;
    case 7:
      return StatusCode::cancelled;
    default:
      return StatusCode::internal;  // UNKNOWN, INTERNAL
  }
}

// Owns the descriptors that came with a message.
struct Fds {
  std::vector<int> fds;
  Fds() = default;
  Fds(Fds&& o) noexcept : fds(std::exchange(o.fds, {})) {}
  Fds& operator=(Fds&& o) noexcept {
    std::swap(fds, o.fds);
    return *this;
  }
  ~Fds() {
    for (int fd : fds) ::close(fd);
  }
};

std::string shape_text(const json& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ",";
    s += shape[i].is_number_integer() ? std::to_string(shape[i].get<std::int64_t>()) : "?";
  }
  return s + "]";
}

}  // namespace

// ---- start --------------------------------------------------------------------------------------

struct PythonProcess::Message {
  json body;
  Fds fds;
  /// The bytes after the JSON text and its NUL (a call's inline tensors); valid until the next
  /// receive().
  std::string_view payload;
  std::string op() const {
    auto it = body.find("op");
    return it != body.end() && it->is_string() ? it->get<std::string>() : std::string();
  }
};

namespace {

// One message on the control socket (SOCK_SEQPACKET: whole or not at all), with a descriptor
// (SCM_RIGHTS) when fd >= 0. The errno of a failure, 0 on success.
int send_packet(int sock, const std::string& text, int fd, int flags) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  for (;;) {
    if (::sendmsg(sock, &msg, MSG_NOSIGNAL | flags) >= 0) return 0;
    if (errno != EINTR) return errno;
  }
}

}  // namespace

/// Messages for the stub made on other threads: a call's responses, a model-control answer.
/// Shared with the callbacks, which may outlive the process.
///
/// A call's response goes to the socket at once from the thread that made it (the called
/// model's), when it can without waiting: nothing is queued before it, no other thread is
/// sending, and the socket takes it without blocking. Otherwise it waits in `items`, and the
/// instance's thread sends it the next time it waits for the stub (receive(), woken by `event`).
/// Either way each call's responses reach the stub in order, and one the stub no longer waits for
/// (its execute has ended: not `live`) is dropped.
struct PythonProcess::Mailbox {
  struct Mail {
    std::string text;
    int fd = -1;            ///< passed with it (SCM_RIGHTS), then closed
    std::uint64_t tag = 0;  ///< the call it answers
    bool last = false;      ///< the call's last response
    bool call = false;      ///< a response to a call (else a model-control answer)
  };
  std::mutex mu;
  std::vector<Mail> items;       // under mu
  std::set<std::uint64_t> live;  // under mu: the calls of the execute in progress
  bool flushing = false;         // under mu: the instance's thread sends what it took
  int event = -1;                // eventfd: readable while items is not empty
  /// Set (before `event` is written) when items get something; cleared by take(). receive()
  /// reads the socket before polling only while it is clear, so that mail is never overtaken
  /// for long by a stub that keeps sending.
  std::atomic<bool> has_mail{false};
  /// Every send on the socket holds it (the instance thread's, and the direct ones above); sock
  /// is -1 once the process's socket is closed.
  std::mutex send_mu;
  int sock = -1;

  Mailbox() : event(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  ~Mailbox() {
    for (Mail& m : items) {
      if (m.fd >= 0) ::close(m.fd);
    }
    if (event >= 0) ::close(event);
  }
  void post(Mail m) {
    {
      std::lock_guard lock(mu);
      if (m.call) {
        if (!live.contains(m.tag)) {  // its execute has ended: the stub no longer waits for it
          if (m.fd >= 0) ::close(m.fd);
          return;
        }
        if (m.last) live.erase(m.tag);
        if (items.empty() && !flushing) {
          std::unique_lock send_lock(send_mu, std::try_to_lock);
          if (send_lock.owns_lock() && sock >= 0 &&
              send_packet(sock, m.text, m.fd, MSG_DONTWAIT) == 0) {
            if (m.fd >= 0) ::close(m.fd);
            return;
          }
        }
      }
      items.push_back(std::move(m));
      has_mail.store(true, std::memory_order_release);
    }
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(event, &one, sizeof(one));
  }
  /// A call's response as the stub reads it: {"op":"response","tag","final","outputs":[{name,
  /// datatype,shape,offset,size}]} then NUL and the tensors' bytes, or with "fd":true the bytes
  /// in a sealed memfd passed alongside; or {"op":"response","tag","final":true,"error","code"}.
  static Mail response(std::uint64_t tag, Result<HostResponse> r);
  /// What waits, for the instance's thread, which sends it and calls take() again until it gets
  /// nothing (flushing stays set meanwhile, so that no direct send overtakes what it took).
  std::vector<Mail> take() {
    std::uint64_t n = 0;
    [[maybe_unused]] const ssize_t got = ::read(event, &n, sizeof(n));
    std::lock_guard lock(mu);
    flushing = !items.empty();
    has_mail.store(false, std::memory_order_relaxed);
    return std::exchange(items, {});
  }
  void begin_call(std::uint64_t tag) {
    std::lock_guard lock(mu);
    live.insert(tag);
  }
  void end_call(std::uint64_t tag) {
    std::lock_guard lock(mu);
    live.erase(tag);
  }
  /// The execute has ended: its calls' responses, queued or to come, are dropped.
  void end_calls() {
    std::lock_guard lock(mu);
    live.clear();
    std::erase_if(items, [](Mail& m) {
      if (!m.call) return false;
      if (m.fd >= 0) ::close(m.fd);
      return true;
    });
  }
};

namespace {

// Ours -> pb_utils.TritonError's codes (code_of_triton_error's inverse).
int triton_error_code(StatusCode code) {
  switch (code) {
    case StatusCode::not_found:
      return 2;
    case StatusCode::invalid_argument:
      return 3;
    case StatusCode::unavailable:
    case StatusCode::resource_exhausted:
    case StatusCode::deadline_exceeded:
      return 4;
    case StatusCode::failed_precondition:
      return 5;
    case StatusCode::already_exists:
      return 6;
    case StatusCode::cancelled:
      return 7;
    default:
      return 1;
  }
}

// Tensors up to this many bytes in all travel inside the message; more go in a memfd of their own.
constexpr std::size_t kInlineTensorBytes = 64 * 1024;

json reply_error(std::uint64_t tag, const Status& s) {
  return {{"op", "reply"},
          {"tag", tag},
          {"error", std::string(s.message())},
          {"code", triton_error_code(s.code())}};
}

}  // namespace

PythonProcess::Mailbox::Mail PythonProcess::Mailbox::response(std::uint64_t tag,
                                                              Result<HostResponse> r) {
  Mail mail;
  mail.tag = tag;
  mail.call = true;
  json j = {{"op", "response"}, {"tag", tag}};
  if (!r.ok()) {
    j["final"] = true;
    j["error"] = std::string(r.status().message());
    j["code"] = triton_error_code(r.status().code());
    mail.last = true;
    mail.text = j.dump();
    return mail;
  }
  mail.last = r->final;
  j["final"] = r->final;
  json outputs = json::array();
  std::size_t total = 0;
  for (const auto& [name, t] : r->outputs) {
    outputs.push_back({{"name", name},
                       {"datatype", datatype_name(t.dtype())},
                       {"shape", t.shape()},
                       {"offset", total},
                       {"size", t.byte_size()}});
    total += align_up(t.byte_size());
  }
  j["outputs"] = std::move(outputs);
  auto fill = [&](char* base) {
    std::size_t offset = 0;
    for (const auto& [name, t] : r->outputs) {
      if (t.byte_size() > 0) std::memcpy(base + offset, t.data(), t.byte_size());
      offset += align_up(t.byte_size());
    }
  };
  if (total <= kInlineTensorBytes) {
    std::string head = j.dump();
    mail.text.resize(head.size() + 1 + total);
    std::memcpy(mail.text.data(), head.data(), head.size());
    mail.text[head.size()] = '\0';
    fill(mail.text.data() + head.size() + 1);
    return mail;
  }
  // A memfd of its own, sealed against any change: the stub's arrays are views of it.
  const int fd = ::memfd_create("asyncinfer-python-response", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  void* map = MAP_FAILED;
  if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(total)) == 0) {
    map = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (map == MAP_FAILED) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    return response(tag, resource_exhausted_error("a response of " + std::to_string(total) +
                                                  " bytes for model.py: " + errno_text(e)));
  }
  fill(static_cast<char*>(map));
  ::munmap(map, total);
  ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);
  j["fd"] = true;
  mail.text = j.dump();
  mail.fd = fd;
  return mail;
}

Result<std::unique_ptr<PythonProcess>> PythonProcess::start(
    std::shared_ptr<const PythonSetup> setup, std::string instance_name,
    const std::stop_token* stop, bool stop_bounds_initialize) {
  std::unique_ptr<PythonProcess> p(new PythonProcess(std::move(setup), std::move(instance_name)));
  ASYNCINFER_RETURN_IF_ERROR(p->spawn(stop, stop_bounds_initialize));
  return p;
}

Result<std::string> PythonProcess::auto_complete(std::shared_ptr<const PythonSetup> setup,
                                                 const std::string& config_json) {
  std::unique_ptr<PythonProcess> p(new PythonProcess(setup, setup->model_name + "_auto_complete"));
  p->auto_complete_in_ = config_json;
  ASYNCINFER_RETURN_IF_ERROR(p->spawn(nullptr, false));
  return std::move(p->auto_complete_out_);
}

Status PythonProcess::fail(StatusCode code, const std::string& what) {
  return Status(
      code, "python model '" + setup_->model_name + "' instance " + instance_name_ + ": " + what);
}

Status PythonProcess::spawn(const std::stop_token* stop, bool stop_bounds_initialize) {
  const PythonSetup& s = *setup_;
  buffer_.assign(kMaxMessage, '\0');
  mail_ = std::make_shared<Mailbox>();
  if (mail_->event < 0) return fail(StatusCode::internal, "eventfd: " + errno_text(errno));
  wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_ < 0) return fail(StatusCode::internal, "eventfd: " + errno_text(errno));
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return fail(StatusCode::internal, "socketpair: " + errno_text(errno));
  }
  sock_ = sv[0];
  mail_->sock = sock_;
  int child = sv[1];
  if (child == 3) {  // dup2(3, 3) would leave it close-on-exec
    child = ::fcntl(sv[1], F_DUPFD_CLOEXEC, 4);
    ::close(sv[1]);
  }
  int life[2];
  if (::pipe2(life, O_CLOEXEC) != 0) {
    ::close(child);
    return fail(StatusCode::internal, "pipe2: " + errno_text(errno));
  }
  life_ = life[1];
  int life_child = life[0];
  if (life_child == 3 || life_child == 4) {  // keep it clear of the fds being set up
    life_child = ::fcntl(life[0], F_DUPFD_CLOEXEC, 5);
    ::close(life[0]);
  }
  if (child == 4) {
    const int moved = ::fcntl(child, F_DUPFD_CLOEXEC, 5);
    ::close(child);
    child = moved;
  }
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_adddup2(&actions, child, 3);
  posix_spawn_file_actions_adddup2(&actions, life_child, 4);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  sigset_t none;
  sigset_t all;
  sigemptyset(&none);
  sigfillset(&all);
  // Own process group; no signal blocked or ignored because the server's threads had it so.
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  std::string arg0 = s.interpreter;
  std::string dash_c = "-c";
  std::string bootstrap = kBootstrap;
  std::string name = "asyncinfer-python-stub";
  std::string model_py = s.model_py;
  std::string instance = instance_name_;
  std::array<char*, 7> argv = {arg0.data(),     dash_c.data(),   bootstrap.data(), name.data(),
                               model_py.data(), instance.data(), nullptr};
  // A bare name ("python3") is looked up on PATH, as a shell would.
  const bool search = s.interpreter.find('/') == std::string::npos;
  const int rc =
      search ? ::posix_spawnp(&pid_, s.interpreter.c_str(), &actions, &attr, argv.data(), environ)
             : ::posix_spawn(&pid_, s.interpreter.c_str(), &actions, &attr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(child);
  ::close(life_child);
  if (rc != 0) {
    pid_ = -1;
    return fail(StatusCode::unavailable,
                "cannot start the interpreter '" + s.interpreter + "': " + errno_text(rc) +
                    " (config.pbtxt parameters { key: \"python_interpreter\" } picks another)");
  }
  pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd_ < 0) {
    const int e = errno;
    kill_and_reap();
    return fail(StatusCode::internal, "pidfd_open: " + errno_text(e));
  }
  ASYNCINFER_RETURN_IF_ERROR(send_message(std::string(kPythonStubSource)));
  ASYNCINFER_RETURN_IF_ERROR(send_message(std::string(kPythonUtilsSource)));
  json args = {
      {"model_config", s.config_json},
      {"model_instance_kind", "CPU"},
      {"model_instance_name", instance_name_},
      {"model_instance_device_id", "0"},
      {"model_repository", s.model_repository},
      {"model_version", s.model_version},
      {"model_name", s.model_name},
  };
  json init = {{"op", "init"}, {"args", std::move(args)}, {"model_py", s.model_py}};
  const bool completing = !auto_complete_in_.empty();
  if (completing) {
    init = {{"op", "auto_complete"},
            {"config", json::parse(auto_complete_in_, nullptr, false)},
            {"model_py", s.model_py}};
    if (init["config"].is_discarded()) {
      kill_and_reap();
      return fail(StatusCode::invalid_argument, "auto_complete: the config is not JSON");
    }
  }
  ASYNCINFER_RETURN_IF_ERROR(send_message(init.dump()));
  // initialize has no requests to finish: a stop kills it at once (no grace).
  const Clock::time_point until = stop != nullptr && stop_bounds_initialize
                                      ? Clock::time_point::max()
                                      : Clock::now() + s.initialize_timeout;
  Result<Message> m = receive(stop, until, std::chrono::milliseconds(0));
  // initialize() may create custom metrics and log (not call other models: Triton's rule).
  for (bool handled = true; m.ok() && handled;) {
    if (Status hs = handle_host_message(*m, &handled); !hs.ok()) return hs;
    if (handled) m = receive(stop, until, std::chrono::milliseconds(0));
  }
  if (!m.ok()) {
    if (stop != nullptr && stop->stop_requested()) {
      kill_and_reap();
      return fail(StatusCode::cancelled,
                  "initialize() was cut short (its load was cancelled); the process was killed");
    }
    if (m.status().code() == StatusCode::deadline_exceeded) {
      kill_and_reap();
      return fail(StatusCode::unavailable, "initialize did not return within " +
                                               std::to_string(s.initialize_timeout.count()) +
                                               " ms; the process was killed");
    }
    return Status(StatusCode::unavailable, std::string(m.status().message()) +
                                               " while loading model.py and running initialize "
                                               "(its output is in the server's log)");
  }
  const std::string op = m->op();
  if (op == "ready" && !completing) return Status();
  if (op == "completed" && completing) {
    auto_complete_out_ = m->body.value("config", json()).dump();
    kill_and_reap();  // it exits by itself; this reaps it
    return Status();
  }
  if (op == "error" && completing) {
    const std::string message = m->body.value("message", std::string("?"));
    kill_and_reap();
    return fail(StatusCode::invalid_argument, "auto_complete_config: " + message);
  }
  if (op == "error") {
    const std::string message = m->body.value("message", std::string("?"));
    const std::string tb = m->body.value("traceback", std::string());
    if (!tb.empty()) {
      log(LogLevel::error, "python model '" + s.model_name + "' instance " + instance_name_ +
                               ": initialize failed:\n" + tb);
    }
    kill_and_reap();
    return fail(StatusCode::unavailable, "initialize failed: " + message);
  }
  kill_and_reap();
  return fail(StatusCode::internal, "the stub answered init with '" + op + "'");
}

// ---- end ----------------------------------------------------------------------------------------

PythonProcess::~PythonProcess() {
  if (pid_ > 0 && !reaped_ && !broken_) {
    // finalize(), bounded: a model that does not return from it is killed like a stuck one.
    if (send_message(json{{"op", "finalize"}}.dump()).ok()) {
      const Clock::time_point until = Clock::now() + setup_->stop_grace;
      Result<Message> m = receive(nullptr, until);
      for (bool handled = true; m.ok() && handled;) {  // finalize() may log, delete metrics
        if (!handle_host_message(*m, &handled).ok()) break;
        // A batch posted ahead whose execute() never ran (its stream closed): its answer.
        if (!handled && m->op() == "done") handled = true;
        if (handled) m = receive(nullptr, until);
      }
    }
  }
  if (pid_ > 0 && !reaped_) kill_and_reap();
  for (InputArena& a : in_) {
    if (a.map != nullptr) ::munmap(a.map, a.size);
    if (a.fd >= 0) ::close(a.fd);
  }
  for (OutputArena& a : out_) {
    if (a.map != nullptr) ::munmap(a.map, a.size);
  }
  if (mail_) {  // no direct send from here on
    std::lock_guard lock(mail_->send_mu);
    mail_->sock = -1;
  }
  if (sock_ >= 0) ::close(sock_);
  if (wake_ >= 0) ::close(wake_);
  if (pidfd_ >= 0) ::close(pidfd_);
  if (life_ >= 0) ::close(life_);
}

bool PythonProcess::exited() const noexcept {
  if (pid_ <= 0 || reaped_ || pidfd_ < 0) return true;
  pollfd p{pidfd_, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & POLLIN) != 0;
}

// ---- control messages ---------------------------------------------------------------------------

std::string_view PythonProcess::output_bytes() const {
  const OutputArena& a = out_.at(static_cast<std::size_t>(slot_));
  return {static_cast<const char*>(a.map), a.size};
}

Status PythonProcess::send_message(const std::string& text, int fd) {
  if (text.size() > kMaxMessage) {
    return fail(StatusCode::internal,
                "a control message of " + std::to_string(text.size()) + " bytes is over the limit");
  }
  int e = 0;
  {
    std::lock_guard lock(mail_->send_mu);
    e = send_packet(sock_, text, fd, 0);
  }
  if (e == 0) return Status();
  const std::string how = kill_and_reap();
  return fail(StatusCode::unavailable,
              "the Python process " + how + " (sending to it failed: " + errno_text(e) + ")");
}

Result<PythonProcess::Message> PythonProcess::receive(
    const std::stop_token* stop, Clock::time_point deadline,
    std::optional<std::chrono::milliseconds> grace) {
  auto wake = [fd = wake_] {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(fd, &one, sizeof(one));
  };
  std::optional<std::stop_callback<decltype(wake)>> on_stop;
  if (stop != nullptr && !stopping_) on_stop.emplace(*stop, wake);
  // The first try reads the socket without a poll (a system call saved when the stub's message
  // is already there: it ran ahead, two batches in flight), unless a stop or mail waits: those
  // are found by the poll, which every later try makes.
  bool first = stop == nullptr || stopping_ || !stop->stop_requested();
  if (mail_->has_mail.load(std::memory_order_acquire)) first = false;
  for (;;) {
    const Clock::time_point now = Clock::now();
    const Clock::time_point until = std::min(deadline, grace_end_);
    if (now >= until) {
      const std::string how = kill_and_reap();
      if (stopping_ && now >= grace_end_) {
        return fail(StatusCode::cancelled,
                    "every request of the batch ended, and model.py had not returned " +
                        std::to_string(setup_->stop_grace.count()) +
                        " ms later: the process was stopped (" + how +
                        ") and is restarted at the next batch");
      }
      return fail(StatusCode::deadline_exceeded, "no answer in time; the process " + how);
    }
    if (std::exchange(first, false)) {
      Result<Message> m = read_message();
      if (!m.ok() || m->body.is_object()) return m;  // else nothing there yet: poll
    }
    int timeout_ms = -1;
    if (until != Clock::time_point::max()) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
      timeout_ms = static_cast<int>(std::min<long long>(left, INT_MAX));
    }
    // The socket first: a message written just before the process exited is still read.
    std::array<pollfd, 4> fds = {pollfd{sock_, POLLIN, 0}, pollfd{pidfd_, POLLIN, 0},
                                 pollfd{mail_->event, POLLIN, 0}, pollfd{wake_, POLLIN, 0}};
    const int r = ::poll(fds.data(), stopping_ ? 3 : 4, timeout_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return fail(StatusCode::internal, "poll: " + errno_text(errno));
    }
    if (!stopping_ && (fds[3].revents & POLLIN) != 0) {
      std::uint64_t n = 0;
      [[maybe_unused]] const ssize_t got = ::read(wake_, &n, sizeof(n));
      if (stop != nullptr && stop->stop_requested()) {
        stopping_ = true;  // once per batch: later messages do not renew the grace period
        grace_end_ = Clock::now() + grace.value_or(setup_->stop_grace);
        // Every request of the batch has ended: so has what model.py asked of other models.
        for (auto& [tag, call] : calls_) call->cancel();
      }
      continue;
    }
    if ((fds[2].revents & POLLIN) != 0) {
      if (Status s = flush_mail(); !s.ok()) return s;
      continue;
    }
    if ((fds[0].revents & POLLIN) == 0) {
      if (fds[0].revents != 0 || (fds[1].revents & POLLIN) != 0) {
        // The process exited (a child of model.py may still hold the socket open) or the socket
        // broke.
        return fail(StatusCode::unavailable, "the Python process " + exit_description());
      }
      continue;
    }
    Result<Message> m = read_message();
    if (!m.ok() || m->body.is_object()) return m;
  }
}

Result<PythonProcess::Message> PythonProcess::read_message() {
  for (;;) {
    iovec iov{buffer_.data(), buffer_.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(sock_, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return Message{};  // nothing there yet (its body is no object)
      const int e = errno;
      return fail(StatusCode::unavailable,
                  "the Python process " + kill_and_reap() + " (" + errno_text(e) + ")");
    }
    Message m;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < count; ++i) {
          int fd = -1;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          m.fds.fds.push_back(fd);
        }
      }
    }
    if (n == 0) {
      // The stub closed its end: it exited (or crashed).
      return fail(StatusCode::unavailable, "the Python process " + exit_description());
    }
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
      return fail(StatusCode::internal, "the stub sent a message over " +
                                            std::to_string(kMaxMessage) + " bytes; the process " +
                                            kill_and_reap());
    }
    // JSON text, then (a call's inline tensors) NUL and bytes.
    const char* end = buffer_.data() + n;
    const char* nul = static_cast<const char*>(std::memchr(buffer_.data(), '\0', n));
    if (nul != nullptr) {
      m.payload = std::string_view(nul + 1, static_cast<std::size_t>(end - nul - 1));
      end = nul;
    }
    const char* begin = buffer_.data();
    m.body = json::parse(begin, end, nullptr, /*allow_exceptions=*/false);
    if (!m.body.is_object()) {
      return fail(
          StatusCode::internal,
          "the stub sent a message that is not a JSON object; the process " + kill_and_reap());
    }
    return m;
  }
}

std::string PythonProcess::exit_description() {
  // After EOF the process is exiting: wait for it (bounded), then kill what is left.
  if (pid_ > 0 && !reaped_ && pidfd_ >= 0) {
    pollfd p{pidfd_, POLLIN, 0};
    while (::poll(&p, 1, static_cast<int>(kExitWait / std::chrono::milliseconds(1))) < 0 &&
           errno == EINTR) {
    }
  }
  return kill_and_reap();
}

std::string PythonProcess::kill_and_reap() {
  broken_ = true;
  if (pid_ <= 0) return "is not running";
  if (!reaped_) {
    // Until it is reaped its pid (and so its process group id) cannot be reused: kill the whole
    // group (what model.py started goes too), then reap it.
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);
    int st = 0;
    pid_t r = 0;
    do {
      r = ::waitpid(pid_, &st, 0);
    } while (r < 0 && errno == EINTR);
    status_ = st;
    reaped_ = true;
  }
  if (WIFEXITED(status_)) return "exited with status " + std::to_string(WEXITSTATUS(status_));
  if (WIFSIGNALED(status_)) {
    const int sig = WTERMSIG(status_);
    const char* name = sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) +
           (name != nullptr ? " (SIG" + std::string(name) + ")" : std::string());
  }
  return "ended";
}

// ---- arenas -------------------------------------------------------------------------------------

Status PythonProcess::write_inputs(const BatchIO& io, int slot, std::string* message,
                                   bool* new_arena) {
  InputArena& arena = in_.at(static_cast<std::size_t>(slot));
  const ModelSignature& sig = setup_->signature;
  // Each request's own tensors (BatchIO::request_inputs: the model takes requests apart), or a
  // lone request's.
  const bool apart = !io.request_inputs.empty();
  const std::size_t count = apart ? io.request_inputs.size() : 1;
  if (!apart && io.request_rows.size() > 1) {
    return fail(StatusCode::internal,
                "a batch of " + std::to_string(io.request_rows.size()) +
                    " requests came joined; the python backend takes them apart "
                    "(BatchIO::request_inputs)");
  }
  struct Part {
    Tensor tensor;
    std::size_t offset;
  };
  std::vector<Part> parts;
  parts.reserve(count * sig.inputs.size());
  std::size_t total = 0;
  for (std::size_t j = 0; j < count; ++j) {
    for (std::size_t i = 0; i < sig.inputs.size(); ++i) {
      const Tensor& t = apart ? io.request_inputs[j].at(i) : io.host_inputs.at(i);
      parts.push_back({t, total});
      // An optional input the request left out is not sent.
      if (t.defined()) total += align_up(t.byte_size());
    }
  }
  // The requests' description (their inputs' places, ids, parameters, sequence flags). It goes
  // in the execute message, or, when that would pass the socket's limit (a request's
  // parameters may be any size), into the arena after the tensors: the message then says where.
  json requests = json::array();
  std::size_t k = 0;
  for (std::size_t j = 0; j < count; ++j) {
    json inputs = json::array();
    for (std::size_t i = 0; i < sig.inputs.size(); ++i, ++k) {
      const Part& p = parts[k];
      if (!p.tensor.defined()) continue;
      inputs.push_back({{"name", sig.inputs[i].name},
                        {"datatype", datatype_name(p.tensor.dtype())},
                        {"shape", p.tensor.shape()},
                        {"offset", p.offset},
                        {"size", p.tensor.byte_size()}});
    }
    json request = {{"inputs", std::move(inputs)}};
    if (j < io.sequences.size()) {
      // Triton's InferenceRequest.correlation_id() and flags() (SEQUENCE_START 1, _END 2).
      const SequenceFlags& f = io.sequences[j];
      if (const auto* n = std::get_if<std::uint64_t>(&f.id)) {
        request["correlation_id"] = *n;
      } else {
        request["correlation_id"] = std::get<std::string>(f.id);
      }
      request["flags"] = (f.start ? 1 : 0) | (f.end ? 2 : 0);
    }
    if (j < io.contexts.size() && io.contexts[j]) {
      // InferenceRequest.request_id() and parameters() (a JSON object's text).
      const RequestContext& c = *io.contexts[j];
      if (!c.id.empty()) request["id"] = c.id;
      if (!c.parameters_json.empty()) request["parameters"] = c.parameters_json;
    }
    requests.push_back(std::move(request));
  }
  const std::string described = requests.dump();
  // The message's other fields take well under 128 bytes.
  const bool in_arena = described.size() + 128 > kMaxMessage;
  const std::size_t described_at = total;
  const std::size_t needed = in_arena ? total + described.size() : total;

  *new_arena = false;
  if (needed > arena.size) {
    const std::size_t size = std::max({needed, 2 * arena.size, kMinArena});
    const int fd = ::memfd_create("asyncinfer-python-input", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return fail(StatusCode::resource_exhausted, "memfd_create: " + errno_text(errno));
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0 ||
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
      const int e = errno;
      ::close(fd);
      return fail(StatusCode::resource_exhausted,
                  "an input arena of " + std::to_string(size) + " bytes: " + errno_text(e));
    }
    void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return fail(StatusCode::resource_exhausted, "mmap: " + errno_text(e));
    }
    if (arena.map != nullptr) ::munmap(arena.map, arena.size);
    if (arena.fd >= 0) ::close(arena.fd);
    arena.fd = fd;
    arena.map = map;
    arena.size = size;
    *new_arena = true;
  }
  char* base = static_cast<char*>(arena.map);
  for (const Part& p : parts) {
    if (p.tensor.defined() && p.tensor.byte_size() > 0) {
      std::memcpy(base + p.offset, p.tensor.data(), p.tensor.byte_size());
    }
  }
  // The message's text, built around the description instead of dumping it again.
  std::string& text = *message;
  text = R"({"op":"execute","slot":)" + std::to_string(slot);
  if (*new_arena) text += R"(,"arena":)" + std::to_string(arena.size);
  // Coalesced, not batched (BatchIO::coalesced): one execute() a request.
  if (io.coalesced) text += R"(,"alone":true)";
  if (in_arena) {
    std::memcpy(base + described_at, described.data(), described.size());
    text += R"(,"requests_at":[)" + std::to_string(described_at) + "," +
            std::to_string(described.size()) + "]}";
  } else {
    text += R"(,"requests":)";
    text += described;
    text += '}';
  }
  return Status();
}

Status PythonProcess::map_output_arena(const Message& m) {
  auto it = m.body.find("arena");
  if (it == m.body.end()) return Status();
  if (!it->is_number_unsigned() || m.fds.fds.size() != 1) {
    return fail(StatusCode::internal, "the stub sent a new output arena without its descriptor");
  }
  const std::size_t size = it->get<std::size_t>();
  // Sealed, so that model.py cannot shrink it while this side reads it (a SIGBUS here).
  const int seals = ::fcntl(m.fds.fds[0], F_GET_SEALS);
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return fail(StatusCode::internal,
                "the stub's output arena is not sealed against resizing (F_SEAL_SHRINK)");
  }
  struct stat st {};
  if (::fstat(m.fds.fds[0], &st) != 0 || st.st_size < 0 ||
      static_cast<std::size_t>(st.st_size) < size || size == 0) {
    return fail(StatusCode::internal, "the stub's output arena is smaller than it says");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, m.fds.fds[0], 0);
  if (map == MAP_FAILED) return fail(StatusCode::resource_exhausted, "mmap: " + errno_text(errno));
  OutputArena& arena = out_.at(static_cast<std::size_t>(slot_));
  if (arena.map != nullptr) ::munmap(arena.map, arena.size);
  arena.map = map;
  arena.size = size;
  return Status();
}

Result<std::vector<Tensor>> PythonProcess::read_outputs(const void* specs_ptr, std::int64_t rows,
                                                        std::size_t request,
                                                        std::string_view bytes) {
  const json& specs = *static_cast<const json*>(specs_ptr);
  const ModelSignature& sig = setup_->signature;
  const std::string who = "model.py's response to request " + std::to_string(request) + ": ";
  auto bad = [&](const std::string& what) { return fail(StatusCode::internal, who + what); };
  if (!specs.is_array()) return bad("no output list");
  std::vector<Tensor> out(sig.outputs.size());
  for (const json& s : specs) {
    if (!s.is_object() || !s.contains("name") || !s["name"].is_string()) {
      return bad("an output without a name");
    }
    const std::string name = s["name"].get<std::string>();
    std::size_t k = 0;
    while (k < sig.outputs.size() && sig.outputs[k].name != name) ++k;
    if (k == sig.outputs.size()) continue;  // not in the config: dropped, as Triton does
    const TensorSpec& want = sig.outputs[k];
    if (out[k].defined()) return bad("output '" + name + "' appears twice");
    const std::string datatype = s.value("datatype", std::string());
    const Result<DType> dtype = parse_dtype(datatype);  // the protocol's names ("FP32", "BYTES")
    if (!dtype.ok() || *dtype != want.dtype) {
      return bad("output '" + name + "' is " + (datatype.empty() ? "?" : datatype) +
                 ", the config says " + std::string(datatype_name(want.dtype)));
    }
    const json& js = s.value("shape", json());
    Shape shape;
    bool ok = js.is_array() && js.size() == want.shape.size();
    for (std::size_t d = 0; ok && d < js.size(); ++d) {
      ok = js[d].is_number_integer() && js[d].get<std::int64_t>() >= 0;
      if (!ok) break;
      const std::int64_t v = js[d].get<std::int64_t>();
      if (sig.batched && d == 0) {
        ok = v == rows;
      } else {
        ok = want.shape[d] < 0 || want.shape[d] == v;
      }
      shape.push_back(v);
    }
    if (!ok && js.is_array() && std::any_of(js.begin(), js.end(), [](const json& d) {
          return d.is_number_integer() && d.get<std::int64_t>() == 0;
        })) {
      // An empty output (np.array([]) where the config says [1, -1]): no values to place, so it
      // takes the config's rank with 0 for each variable dim, as Triton passes it on.
      shape = want.shape;
      for (std::int64_t& d : shape) d = std::max<std::int64_t>(d, 0);
      if (sig.batched && !shape.empty()) shape[0] = rows;
      ok = std::find(shape.begin(), shape.end(), 0) != shape.end();
    }
    if (!ok) {
      Shape expected = want.shape;
      if (sig.batched && !expected.empty()) expected[0] = rows;
      return bad("output '" + name + "' has shape " + shape_text(js) + ", expected " +
                 shape_to_string(expected) + " (-1: any)" +
                 (sig.batched ? " with dim 0 the request's " + std::to_string(rows) + " row(s)"
                              : std::string()));
    }
    if (!s.contains("offset") || !s["offset"].is_number_unsigned() || !s.contains("size") ||
        !s["size"].is_number_unsigned()) {
      return bad("output '" + name + "' has no offset or size");
    }
    const std::size_t offset = s["offset"].get<std::size_t>();
    const std::size_t size = s["size"].get<std::size_t>();
    if (offset > bytes.size() || size > bytes.size() - offset) {
      return bad("output '" + name + "' lies outside its bytes");
    }
    ASYNCINFER_ASSIGN_OR_RETURN(std::shared_ptr<Storage> storage,
                                Storage::allocate_host(std::max<std::size_t>(size, 1)));
    if (size > 0) std::memcpy(storage->data(), bytes.data() + offset, size);
    Result<Tensor> t = Tensor::from_storage(std::move(storage), *dtype, shape);
    if (!t.ok()) return bad("output '" + name + "': " + std::string(t.status().message()));
    if (t->byte_size() != size) {
      return bad("output '" + name + "' has " + std::to_string(size) + " bytes for shape " +
                 shape_to_string(shape) + " (" + std::to_string(t->byte_size()) + " expected)");
    }
    out[k] = std::move(*t);
  }
  for (std::size_t k = 0; k < out.size(); ++k) {
    if (!out[k].defined()) {
      return bad("no output '" + sig.outputs[k].name + "' (the config lists it)");
    }
  }
  return out;
}

// ---- execute ------------------------------------------------------------------------------------

Status PythonProcess::post(const BatchIO& io, int slot) {
  if (!alive()) return fail(StatusCode::unavailable, "the Python process is not running");
  std::string text;
  bool new_arena = false;
  ASYNCINFER_RETURN_IF_ERROR(write_inputs(io, slot, &text, &new_arena));  // within kMaxMessage
  int e = 0;
  {
    std::lock_guard lock(mail_->send_mu);
    e = send_packet(sock_, text, new_arena ? in_.at(static_cast<std::size_t>(slot)).fd : -1, 0);
  }
  if (e != 0) {
    // Not killed here: the thread in execute() owns the process's end, and finds it. A new
    // arena the stub never got is dropped, so that the slot's next batch makes and passes one.
    if (new_arena) {
      InputArena& arena = in_.at(static_cast<std::size_t>(slot));
      ::munmap(arena.map, arena.size);
      ::close(arena.fd);
      arena = InputArena{};
    }
    return fail(StatusCode::unavailable, "sending to the Python process: " + errno_text(e));
  }
  return Status();
}

Status PythonProcess::execute(BatchIO& io, const std::stop_token& stop, int slot, bool posted) {
  if (!alive()) return fail(StatusCode::unavailable, "the Python process is not running");
  slot_ = slot;
  stopping_ = false;
  grace_end_ = Clock::time_point::max();
  posted_send_error_.clear();
  io_ = &io;
  Status s;
  try {
    s = execute_messages(io, stop, posted);
  } catch (const std::exception& e) {  // a message whose fields have the wrong types
    s = fail(StatusCode::internal, std::string("the stub sent a malformed message (") + e.what() +
                                       "); the process " + kill_and_reap());
  }
  io_ = nullptr;
  end_calls();
  return s;
}

void PythonProcess::end_calls() {
  mail_->end_calls();  // their late responses are dropped
  for (auto& [tag, call] : calls_) call->cancel();
  calls_.clear();
}

Status PythonProcess::flush_mail() {
  for (std::vector<Mailbox::Mail> mails = mail_->take(); !mails.empty(); mails = mail_->take()) {
    for (Mailbox::Mail& mail : mails) {
      const int fd = std::exchange(mail.fd, -1);
      Status s = send_message(mail.text, fd);
      if (fd >= 0) ::close(fd);
      if (!s.ok()) {
        for (Mailbox::Mail& rest : mails) {
          if (rest.fd >= 0) ::close(std::exchange(rest.fd, -1));
        }
        return s;
      }
    }
  }
  return Status();
}

Status PythonProcess::handle_host_message(Message& m, bool* handled) {
  *handled = true;
  const std::string op = m.op();
  try {
    const std::uint64_t tag = m.body.value("tag", std::uint64_t{0});
    if (op == "log") {
      // pb_utils.Logger: INFO 0, WARNING 1, ERROR 2, VERBOSE 3.
      const int level = m.body.value("level", 0);
      const LogLevel l = level == 1   ? LogLevel::warning
                         : level == 2 ? LogLevel::error
                         : level == 3 ? LogLevel::debug
                                      : LogLevel::info;
      log(l, "python model '" + setup_->model_name + "' instance " + instance_name_ + ": " +
                 m.body.value("message", std::string()));
      return Status();
    }
    if (op == "infer") return start_call(m, tag);
    if (op == "cancel_infer") {
      if (auto it = calls_.find(tag); it != calls_.end()) it->second->cancel();
      return Status();
    }
    if (op == "metric_delete") {
      if (setup_->host) setup_->host->metric_delete(m.body.value("metric", std::uint64_t{0}));
      return Status();
    }
    const bool host_op = op == "model_ready" || op == "load_model" || op == "unload_model" ||
                         op == "metric_family" || op == "metric" || op == "metric_update";
    if (!host_op) {
      *handled = false;
      return Status();
    }
    if (!setup_->host) {
      return send_message(
          reply_error(tag, unavailable_error("model '" + setup_->model_name +
                                             "' runs outside a model server: it has no other "
                                             "models to reach and no /metrics"))
              .dump());
    }
    ModelHostLink& host = *setup_->host;
    json reply = {{"op", "reply"}, {"tag", tag}};
    auto answer = [&](auto result) {
      if (!result.ok()) return send_message(reply_error(tag, result.status()).dump());
      reply["value"] = *result;
      return send_message(reply.dump());
    };
    auto text = [&](const char* key) {
      const json& v = m.body.value(key, json());
      if (v.is_string()) return v.get<std::string>();
      if (v.is_number_integer()) return std::to_string(v.get<std::int64_t>());
      return std::string();
    };
    if (op == "model_ready") {
      std::string version = text("version");
      if (version == "-1") version.clear();
      reply["value"] = host.model_ready(text("model"), version);
      return send_message(reply.dump());
    }
    if (op == "load_model" || op == "unload_model") {
      // Answered when the repository has decided, through the mailbox.
      auto done = [mail = mail_, tag](const Status& st) {
        Mailbox::Mail out;
        out.text = st.ok() ? json{{"op", "reply"}, {"tag", tag}, {"value", true}}.dump()
                           : reply_error(tag, st).dump();
        mail->post(std::move(out));
      };
      if (op == "unload_model") {
        host.unload_model(text("model"), std::move(done));
      } else {
        std::optional<std::string> config;
        if (const std::string c = text("config"); !c.empty()) config = c;
        host.load_model(text("model"), std::move(config), std::move(done));
      }
      return Status();
    }
    if (op == "metric_family") {
      const std::string kind = m.body.value("kind", std::string());
      const MetricKind k = kind == "gauge"       ? MetricKind::gauge
                           : kind == "histogram" ? MetricKind::histogram
                                                 : MetricKind::counter;
      if (kind != "counter" && kind != "gauge" && kind != "histogram") {
        return send_message(
            reply_error(tag, invalid_argument_error("metric family kind must be COUNTER, GAUGE "
                                                    "or HISTOGRAM"))
                .dump());
      }
      return answer(host.metric_family(text("name"), text("description"), k));
    }
    if (op == "metric") {
      std::map<std::string, std::string> labels;
      const json given = m.body.value("labels", json::object());  // kept: items() views it
      for (const auto& [key, value] : given.items()) {
        labels[key] = value.is_string() ? value.get<std::string>() : value.dump();
      }
      std::vector<double> buckets;
      const json bounds = m.body.value("buckets", json::array());
      for (const json& b : bounds) buckets.push_back(b.get<double>());
      return answer(host.metric(m.body.value("family", std::uint64_t{0}), labels, buckets));
    }
    // metric_update
    return answer(host.metric_update(m.body.value("metric", std::uint64_t{0}),
                                     m.body.value("what", std::string()),
                                     m.body.value("value", 0.0)));
  } catch (const std::exception& e) {
    return fail(StatusCode::internal, "the stub sent a malformed '" + op + "' message (" +
                                          e.what() + "); the process " + kill_and_reap());
  }
}

Status PythonProcess::start_call(Message& m, std::uint64_t tag) {
  auto refuse = [&](const Status& st) { return send_message(Mailbox::response(tag, st).text); };
  if (io_ == nullptr) {
    return refuse(failed_precondition_error(
        "business logic scripting is only available inside execute(), not in initialize() or "
        "finalize() (as in Triton)"));
  }
  if (!setup_->host) {
    return refuse(unavailable_error("model '" + setup_->model_name +
                                    "' runs outside a model server: there is no other model to "
                                    "call"));
  }
  HostRequest r;
  r.model = m.body.value("model", std::string());
  const json& version = m.body.value("version", json());
  if (version.is_number_integer() && version.get<std::int64_t>() > 0) {
    r.version = std::to_string(version.get<std::int64_t>());
  } else if (version.is_string()) {
    r.version = version.get<std::string>();
  }
  // The tensors: inline after the JSON text (copied here, before the next message reuses the
  // buffer), or in a sealed memfd of their own (mapped: no copy).
  std::shared_ptr<Storage> storage;
  const bool in_fd = m.body.value("fd", false);
  if (in_fd) {
    if (m.fds.fds.size() != 1) {
      return fail(StatusCode::internal, "the stub sent a call's tensors without their descriptor");
    }
    const int fd = m.fds.fds[0];
    const int seals = ::fcntl(fd, F_GET_SEALS);
    struct stat st {};
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_WRITE)) != (F_SEAL_SHRINK | F_SEAL_WRITE) ||
        ::fstat(fd, &st) != 0 || st.st_size <= 0) {
      return refuse(internal_error("the call's tensors are not in a sealed memfd"));
    }
    const auto size = static_cast<std::size_t>(st.st_size);
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) return refuse(resource_exhausted_error("mmap: " + errno_text(errno)));
    storage = std::make_shared<Storage>(
        map, size, Placement{}, [size](void* p) { ::munmap(p, size); }, true);
  } else {
    ASYNCINFER_ASSIGN_OR_RETURN(storage,
                                Storage::allocate_host(std::max<std::size_t>(m.payload.size(), 1)));
    if (!m.payload.empty()) std::memcpy(storage->data(), m.payload.data(), m.payload.size());
  }
  const json inputs = m.body.value("inputs", json::array());
  for (const json& spec : inputs) {
    const std::string name = spec.value("name", std::string());
    const std::string datatype = spec.value("datatype", std::string());
    const Result<DType> dtype = parse_dtype(datatype);
    if (!dtype.ok()) {
      return refuse(invalid_argument_error("input '" + name + "': datatype '" + datatype +
                                           "' has no protocol name"));
    }
    const std::size_t offset = spec.value("offset", std::size_t{0});
    const std::size_t size = spec.value("size", std::size_t{0});
    if (offset > storage->bytes() || size > storage->bytes() - offset) {
      return refuse(internal_error("input '" + name + "' lies outside its bytes"));
    }
    Shape shape = spec.value("shape", Shape{});
    Result<Tensor> t = Tensor::from_storage(storage, *dtype, shape, offset);
    if (!t.ok() || t->byte_size() != size) {
      return refuse(invalid_argument_error(
          "input '" + name + "': " +
          (t.ok() ? std::to_string(size) + " bytes for shape " + shape_to_string(shape)
                  : std::string(t.status().message()))));
    }
    r.inputs.emplace_back(name, std::move(*t));
  }
  const json outputs = m.body.value("outputs", json::array());
  for (const json& o : outputs) {
    r.outputs.push_back(o.get<std::string>());
  }
  r.id = m.body.value("id", std::string());
  const json& corr = m.body.value("correlation_id", json());
  const int flags = m.body.value("flags", 0);
  const bool has_id = (corr.is_number_unsigned() && corr.get<std::uint64_t>() != 0) ||
                      (corr.is_string() && !corr.get<std::string>().empty());
  if (has_id || flags != 0) {
    SequenceFlags f;
    if (corr.is_string()) {
      f.id = corr.get<std::string>();
    } else if (corr.is_number_unsigned()) {
      f.id = corr.get<std::uint64_t>();
    }
    f.start = (flags & 1) != 0;
    f.end = (flags & 2) != 0;
    r.sequence = std::move(f);
  }
  r.priority = m.body.value("priority", 0);
  // The caller's deadline (the latest of its batch's), and the call's own timeout (µs).
  r.deadline = io_->deadline;
  if (const std::int64_t us = m.body.value("timeout", std::int64_t{0}); us > 0) {
    r.deadline = std::min(r.deadline, Clock::now() + std::chrono::microseconds(us));
  }
  auto context = std::make_shared<RequestContext>();
  context->id = r.id;
  if (const json& p = m.body.value("parameters", json()); p.is_object() && !p.empty()) {
    context->parameters_json = p.dump();
  }
  // The chain: that of the request that made the call where the stub says which (a coalesced
  // request's own execute()), else the longest of the batch's requests', then this model.
  if (const json& caller = m.body.value("caller", json());
      caller.is_number_unsigned() && caller.get<std::size_t>() < io_->contexts.size()) {
    if (const auto& c = io_->contexts[caller.get<std::size_t>()]) context->callers = c->callers;
  } else {
    for (const auto& c : io_->contexts) {
      if (c && c->callers.size() > context->callers.size()) context->callers = c->callers;
    }
  }
  context->callers.push_back(setup_->model_name);
  r.context = std::move(context);
  // trace=request.trace(): the index of that request in this batch, whose trace (if it is
  // traced) the call is traced under.
  if (const json& t = m.body.value("trace", json()); t.is_number_unsigned()) {
    const auto j = t.get<std::size_t>();
    if (j < io_->contexts.size() && io_->contexts[j]) r.trace = io_->contexts[j]->trace;
  }
  r.decoupled = m.body.value("decoupled", false);
  mail_->begin_call(tag);  // before: its response may come before infer() returns
  Result<std::shared_ptr<HostCall>> call =
      setup_->host->infer(std::move(r), [mail = mail_, tag](Result<HostResponse> response) {
        mail->post(Mailbox::response(tag, std::move(response)));
      });
  if (!call.ok()) {
    mail_->end_call(tag);
    return refuse(call.status());
  }
  calls_[tag] = std::move(*call);
  return Status();
}

Status PythonProcess::execute_messages(BatchIO& io, const std::stop_token& stop, bool posted) {
  // A stale wake-up (a stop that fired after an earlier batch had ended) is not drained here, a
  // system call per batch: receive() reads it when it shows, finds this batch's stop not
  // requested, and goes on waiting.
  const ModelSignature& sig = setup_->signature;
  const std::size_t requests = io.request_rows.empty() ? 1 : io.request_rows.size();
  std::string text;
  bool new_arena = false;
  if (!posted) {
    ASYNCINFER_RETURN_IF_ERROR(write_inputs(io, slot_, &text, &new_arena));
    ASYNCINFER_RETURN_IF_ERROR(send_message(text, new_arena ? in_[slot_].fd : -1));
  }
  Status first_error;
  for (;;) {
    ASYNCINFER_ASSIGN_OR_RETURN(Message m, receive(&stop, Clock::time_point::max()));
    bool handled = false;
    ASYNCINFER_RETURN_IF_ERROR(handle_host_message(m, &handled));
    if (handled) continue;
    const std::string op = m.op();
    const std::uint64_t tag = m.body.value("tag", std::uint64_t{0});
    if (op == "is_cancelled") {
      const std::size_t r = m.body.value("request", std::size_t{0});
      const bool value = io.responses       ? io.responses->is_cancelled(r)
                         : io.request_ended ? io.request_ended(r)
                                            : stop.stop_requested();
      ASYNCINFER_RETURN_IF_ERROR(
          send_message(json{{"op", "cancelled"}, {"tag", tag}, {"value", value}}.dump()));
      continue;
    }
    if (op == "send") {
      // A send with a tag waits for this answer; one without (a decoupled model's non-final
      // response, its tensors inline after the JSON text) is posted: model.py has gone on, and a
      // failure is told in the answer to its next answered send.
      const bool unanswered = !m.body.contains("tag");
      json reply = {{"op", "sent"}, {"tag", tag}};
      const std::size_t r = m.body.value("request", requests);
      // A grown output arena is mapped whatever else the message says (the stub passes it until
      // a message carrying it has been sent).
      Status s = map_output_arena(m);
      if (!s.ok()) {
        // answered with its error (below), as any failed send
      } else if (!io.responses) {
        s = fail(StatusCode::internal, "model.py used a response sender, but it is not decoupled");
      } else if (r >= requests) {
        s = fail(StatusCode::internal, "model.py sent a response for request " + std::to_string(r) +
                                           " of " + std::to_string(requests));
      } else if (m.body.contains("error")) {
        // An error response (Triton's way to fail one request): that request fails with the
        // model's words once model.py is done (BatchIO::request_errors); the others go on. The
        // model's send succeeds.
        if (io.request_errors.empty()) io.request_errors.resize(requests);
        if (io.request_errors[r].ok()) {
          io.request_errors[r] = Status(code_of_triton_error(m.body.value("code", 1)),
                                        m.body.value("error", std::string("?")));
        }
      } else if (m.body.contains("outputs")) {
        const bool inline_tensors = m.body.value("inline", false);
        const std::string_view bytes = inline_tensors ? m.payload : output_bytes();
        Result<std::vector<Tensor>> outs =
            read_outputs(&m.body["outputs"], io.responses->rows(r), r, bytes);
        s = outs.ok() ? io.responses->send(r, std::move(*outs)) : outs.status();
        if (s.code() == StatusCode::cancelled) {
          s = Status();  // the request has ended: the model learns it from is_cancelled
          reply["cancelled"] = true;
        }
      }
      if (!s.ok()) {
        if (first_error.ok()) first_error = s;
        if (unanswered) {
          if (posted_send_error_.empty()) posted_send_error_ = std::string(s.message());
        } else {
          reply["error"] = std::string(s.message());
        }
      }
      if (unanswered) continue;
      if (!reply.contains("error") && !posted_send_error_.empty()) {
        reply["error"] = "an earlier send failed: " + std::exchange(posted_send_error_, {});
      }
      if (!reply.contains("cancelled"))
        reply["cancelled"] = io.responses && r < requests && io.responses->is_cancelled(r);
      ASYNCINFER_RETURN_IF_ERROR(send_message(reply.dump()));
      continue;
    }
    if (op != "done") {
      return fail(StatusCode::internal,
                  "the stub sent '" + op + "' during execute; the process " + kill_and_reap());
    }
    ASYNCINFER_RETURN_IF_ERROR(map_output_arena(m));
    // An execute() that raised: its traceback logged, its message the requests' error.
    const auto raised = [&](const json& what, const std::string& message) {
      const std::string tb = what.value("traceback", std::string());
      if (!tb.empty()) {
        log(LogLevel::error, "python model '" + setup_->model_name + "' instance " +
                                 instance_name_ + ": execute raised:\n" + tb);
      }
      return fail(StatusCode::internal, "execute raised " + message);
    };
    if (m.body.contains("error")) {
      return raised(m.body, m.body.value("error", std::string("an exception")));
    }
    if (sig.decoupled) return first_error;
    const json& responses = m.body.value("responses", json::array());
    if (!responses.is_array() || responses.size() != requests) {
      return fail(StatusCode::internal,
                  "execute returned " +
                      std::to_string(responses.is_array() ? responses.size() : 0) +
                      " responses for " + std::to_string(requests) + " requests");
    }
    std::vector<std::vector<Tensor>> per_request(requests);
    const auto rows_of = [&](std::size_t j) {
      return io.request_rows.empty() ? io.batch_size : io.request_rows[j];
    };
    for (std::size_t j = 0; j < requests; ++j) {
      const json& resp = responses[j];
      if (resp.contains("raised")) {
        // A coalesced request's own execute() raised (BatchIO::coalesced): that request fails
        // as a batch of its own would have.
        if (io.request_errors.empty()) io.request_errors.resize(requests);
        io.request_errors[j] = raised(resp, resp.value("raised", std::string("an exception")));
        continue;
      }
      if (resp.contains("error")) {
        // An error response fails that request alone, in the model's words (Triton's).
        if (io.request_errors.empty()) io.request_errors.resize(requests);
        io.request_errors[j] = Status(code_of_triton_error(resp.value("code", 1)),
                                      resp.value("error", std::string("?")));
        continue;
      }
      static const json kNone;  // no "outputs": read_outputs says so
      const auto specs = resp.find("outputs");
      Result<std::vector<Tensor>> outs =
          read_outputs(specs != resp.end() ? &*specs : &kNone, rows_of(j), j, output_bytes());
      if (!outs.ok() && io.coalesced) {
        // Its own execute() answered wrongly: that request fails alone.
        if (io.request_errors.empty()) io.request_errors.resize(requests);
        io.request_errors[j] = outs.status();
        continue;
      }
      if (!outs.ok()) return outs.status();
      per_request[j] = std::move(*outs);
    }
    if (!io.request_inputs.empty()) {  // the engine keeps each request's outputs apart
      io.request_outputs = std::move(per_request);
      return Status();
    }
    io.outputs = std::move(per_request[0]);  // a lone request (write_inputs)
    if (io.outputs.empty() && !io.request_errors.empty()) {
      // Failed by its error response: outputs the engine's check passes (not read), with 0 for
      // each variable dim.
      for (const TensorSpec& spec : sig.outputs) {
        Shape shape = spec.shape;
        for (std::int64_t& d : shape) d = std::max<std::int64_t>(d, 0);
        if (sig.batched && !shape.empty()) shape[0] = rows_of(0);
        ASYNCINFER_ASSIGN_OR_RETURN(Tensor t, Tensor::zeros(spec.dtype, shape));
        io.outputs.push_back(std::move(t));
      }
    }
    return Status();
  }
}

}  // namespace asyncinfer::detail
