// limits.hpp — what bounds the resources of `asyncinfer serve` across its frontends (issue 23):
// the bytes that requests in flight hold (MemoryBudget, --max-inflight-bytes), the file
// descriptors that client connections may take (ConnectionBudget: the process's limit less a
// reserve, so that client connections alone never bring it to EMFILE), and the state of each
// listener, which readiness reports (ListenerHealth: a port that cannot accept makes the server
// not ready, with the reason).
//
// Each is a few atomics or one mutex, shared by the HTTP and gRPC frontends through the
// InferenceServer. None of them blocks: a budget that is spent refuses at once, and the caller
// answers 503 / RESOURCE_EXHAUSTED (memory) or closes the connection (descriptors).
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "observers.hpp"

namespace asyncinfer::server {

/// Bytes held by requests in flight, server-wide: request bodies while they are read and decoded,
/// the tensors decoded from them while their requests run, and responses while they are written.
/// Over the limit, new work is refused (HTTP 503, gRPC RESOURCE_EXHAUSTED) while the work already
/// accepted goes on.
class MemoryBudget {
 public:
  /// `limit_bytes` 0 = no limit (counted all the same).
  explicit MemoryBudget(std::size_t limit_bytes) : limit_(limit_bytes) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  /// What one request holds of the budget; returned when it is destroyed. Move-only; used by
  /// one thread at a time.
  class Lease {
   public:
    Lease() = default;
    explicit Lease(MemoryBudget* budget) : budget_(budget) {}
    Lease(Lease&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) { o.bytes_ = 0; }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { release(); }

    /// Makes the lease hold `bytes` (more or fewer than now). Growing is refused, and nothing
    /// changes, when the budget would pass its limit: false.
    bool reserve(std::size_t bytes);
    /// As reserve(), never refused: for bytes that are in memory already (a decoded request, a
    /// response), which refusing would not free.
    void hold(std::size_t bytes);
    void release() { hold(0); }
    std::size_t bytes() const noexcept { return bytes_; }

   private:
    MemoryBudget* budget_ = nullptr;
    std::size_t bytes_ = 0;
  };

  Lease lease() { return Lease(this); }
  std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  std::size_t limit() const noexcept { return limit_; }
  /// The refusal's message: what is held, the limit, the option.
  std::string exhausted_message(std::size_t asked) const;

 private:
  const std::size_t limit_;
  std::atomic<std::size_t> used_{0};
};

/// File descriptors for client connections, server-wide. The serve command sizes it from the
/// process's descriptor limit (RLIMIT_NOFILE) less what is open at start and a reserve, so that
/// accept(), a model load or a shared-memory region still finds a descriptor when every
/// connection slot is taken. A frontend acquires a connection's descriptors after accept() and
/// closes the connection at once when they are refused.
class ConnectionBudget {
 public:
  /// `capacity` 0 = no limit.
  explicit ConnectionBudget(std::size_t capacity) : capacity_(capacity) {}
  ConnectionBudget(const ConnectionBudget&) = delete;
  ConnectionBudget& operator=(const ConnectionBudget&) = delete;

  /// Takes `fds` descriptors; false (nothing taken) when that would pass the capacity.
  bool try_acquire(std::size_t fds);
  /// Returns them, and calls the subscribers that armed themselves since the last release.
  void release(std::size_t fds);

  /// A listener that may wait for descriptors subscribes once: `f` is what to call, on the
  /// thread of a release(), once per arm() (a listener that stopped accepting for want of
  /// descriptors resumes when one comes back). `f` runs under the budget's lock: it must be
  /// short and must not call back into the budget. Returns its id.
  std::size_t subscribe(std::function<void()> f);
  /// Asks for one call of the subscriber's `f` at the next release(); arming twice calls once.
  void arm(std::size_t id);
  /// Ends the subscription; after it returns `f` is not running and never runs again.
  void unsubscribe(std::size_t id);

  std::size_t capacity() const noexcept { return capacity_; }
  std::size_t used() const noexcept { return used_.load(std::memory_order_relaxed); }
  /// A refusal's reason: what is held of what, and how to raise it.
  std::string exhausted_message() const;

 private:
  struct Subscriber {
    std::function<void()> f;
    bool armed = false;
  };

  const std::size_t capacity_;
  std::atomic<std::size_t> used_{0};
  std::atomic<std::size_t> armed_{0};  ///< subscribers armed: release() looks only when > 0
  /// Held while subscribers are called, so that unsubscribe() waits for a call in progress.
  std::mutex mu_;
  std::map<std::size_t, Subscriber> subscribers_;
  std::size_t next_id_ = 0;
};

/// Whether each listener ("http", "grpc", "metrics") can accept connections now. A listener that
/// cannot — its connection limit reached, or accept() failing (EMFILE) — makes the server not
/// ready until it accepts again; the reason is the one readiness reports.
class ListenerHealth {
 public:
  ListenerHealth() = default;
  /// Stops the descriptor watch (below), if it runs.
  ~ListenerHealth();
  ListenerHealth(const ListenerHealth&) = delete;
  ListenerHealth& operator=(const ListenerHealth&) = delete;

  /// `listener` cannot accept: `reason` says why; `descriptors`: because accept() failed for want
  /// of file descriptors (or memory), which recheck_descriptors() re-examines. Returns true when
  /// it was accepting until now (the caller logs the change once). A failure for descriptors
  /// starts the descriptor watch: a thread that, while such a failure stands (and only then),
  /// rechecks every 250 ms and runs the observers when descriptors have come back, since nothing
  /// announces that (a raised limit, files closed elsewhere) and a gRPC Watch client that sees
  /// NOT_SERVING sends nothing that would make the server look. It ends with the failures.
  bool set_failing(std::string_view listener, std::string reason, bool descriptors = false);
  /// Re-examines the failures for want of descriptors: when enough are free again (16; the
  /// process's limit was raised, or something else closed its files), those listeners count as
  /// accepting again — without it, a failure that ended with no connection to prove it would
  /// keep the server unready for good. True when any changed. Readiness calls it when it is
  /// asked for; /proc/self/fd is counted only while such a failure stands. It does not run the
  /// observers (they ask for readiness themselves, and may do so from inside their callback):
  /// InferenceServer::ready() tells its readiness observers of a change it returns.
  bool recheck_descriptors();
  /// `listener` accepts again; true when it was failing until now.
  bool set_accepting(std::string_view listener);
  /// Every listener accepts.
  bool all_accepting() const noexcept { return failing_.load(std::memory_order_acquire) == 0; }
  /// "grpc: <reason>; http: <reason>", or empty.
  std::string reasons() const;
  /// Runs `f` after every change, on the thread that made it (the gRPC health service pushes
  /// it to its watches). Returns an id for remove_observer().
  std::size_t on_change(std::function<void()> f);
  /// After it returns, the observer runs no more (a call in progress has ended).
  void remove_observer(std::size_t id);

 private:
  void notify();

  struct Failure {
    std::string reason;
    bool descriptors = false;
  };

  /// The descriptor watch's loop (set_failing).
  void watch_descriptors();
  /// Under mu_: any failure for want of descriptors stands.
  bool descriptors_failing_locked() const;

  mutable std::mutex mu_;
  std::map<std::string, Failure, std::less<>> reasons_;
  std::atomic<std::size_t> failing_{0};
  std::condition_variable watch_cv_;  // under mu_: the watch's wait, woken to stop it
  std::thread watch_;                 // under mu_: the descriptor watch, while it runs
  bool watching_ = false;             // under mu_
  bool stopping_ = false;             // under mu_
  /// remove_observer() waits for a call in progress (ObserverList's rule).
  ObserverList observers_;
};

/// One descriptor held back (open on /dev/null) for the moment accept() fails with EMFILE: closed,
/// it lets the listener take the connection waiting in its backlog and close it at once, so the
/// backlog drains (clients get a prompt close, not a hang) and the listener does not spin on a
/// socket that stays readable (the technique of libev's and nginx's accept loops).
class SpareDescriptor {
 public:
  SpareDescriptor();
  ~SpareDescriptor();
  SpareDescriptor(const SpareDescriptor&) = delete;
  SpareDescriptor& operator=(const SpareDescriptor&) = delete;

  enum class Shed : std::uint8_t {
    shed,          ///< a waiting connection was taken and closed: accept again
    none_waiting,  ///< no connection was waiting (Linux's accept() fails with EMFILE before it
                   ///< looks at the backlog): wait until the socket is readable, then accept
    no_spare,      ///< no spare descriptor could be had: wait for descriptors to come back
  };
  /// Closes the spare (opening it first if it was lost), accepts one connection of `listen_fd`
  /// and closes it, and opens the spare again.
  Shed shed_one(int listen_fd);

 private:
  int fd_ = -1;
};

/// Whether an accept() error means the process (or system) is out of a resource, as opposed to
/// a connection that went away before it was accepted.
bool accept_out_of_resources(int error_number);

/// Descriptors a failure for want of them needs free again before a listener counts as able to
/// accept: one accept that succeeds, or one free descriptor, is no proof at the edge of the limit
/// (the spare descriptor's trick frees one by itself).
constexpr std::size_t kFreeToRecover = 16;
/// At least kFreeToRecover descriptors are free under the soft RLIMIT_NOFILE (counts
/// /proc/self/fd: for a listener that is failing, not for every accept).
bool descriptors_recovered();

}  // namespace asyncinfer::server
