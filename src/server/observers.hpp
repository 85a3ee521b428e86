// observers.hpp — ObserverList: callbacks told that something may have changed (the server's
// readiness), run on the thread that made the change. What lets the gRPC health service push a
// change to its Watch calls instead of comparing the readiness on a timer (grpc_server.hpp,
// "Health"): ModelRepository tells its list of each snapshot it publishes and of each engine's
// health change; InferenceServer tells its own of those and of the start of a drain;
// ListenerHealth (limits.hpp) tells its own of each listener that stops or starts accepting.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>

namespace asyncinfer::server {

class ObserverList {
 public:
  ObserverList() = default;
  ObserverList(const ObserverList&) = delete;
  ObserverList& operator=(const ObserverList&) = delete;

  /// Adds `f`; returns an id for remove().
  std::size_t add(std::function<void()> f) {
    std::lock_guard lock(mu_);
    observers_.emplace(next_, std::move(f));
    return next_++;
  }
  /// After it returns `f` is not running and never runs again (it waits for a call in
  /// progress). Must not be called from inside an observer of this list.
  void remove(std::size_t id) {
    std::lock_guard lock(mu_);
    observers_.erase(id);
  }
  /// Runs every observer, in the order added, on the calling thread. They run under this list's
  /// lock (so that remove() can wait for them): an observer must be short, must not block, and
  /// must not add, remove or notify on this list. The caller holds no lock that an observer
  /// takes (the readiness it asks for).
  void notify() {
    std::lock_guard lock(mu_);
    for (auto& [id, f] : observers_) f();
  }

 private:
  std::mutex mu_;
  std::map<std::size_t, std::function<void()>> observers_;  // under mu_
  std::size_t next_ = 0;                                    // under mu_
};

}  // namespace asyncinfer::server
