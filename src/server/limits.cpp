// MemoryBudget, ConnectionBudget and ListenerHealth (limits.hpp).
#include "limits.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <utility>

namespace asyncinfer::server {

// ---- MemoryBudget ------------------------------------------------------------------------------

MemoryBudget::Lease& MemoryBudget::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    budget_ = o.budget_;
    bytes_ = o.bytes_;
    o.bytes_ = 0;
  }
  return *this;
}

bool MemoryBudget::Lease::reserve(std::size_t bytes) {
  if (budget_ == nullptr) return true;
  if (bytes <= bytes_ || budget_->limit_ == 0) {
    hold(bytes);
    return true;
  }
  const std::size_t more = bytes - bytes_;
  std::size_t used = budget_->used_.load(std::memory_order_relaxed);
  do {
    if (used + more > budget_->limit_ || used + more < used) return false;
  } while (!budget_->used_.compare_exchange_weak(used, used + more, std::memory_order_relaxed));
  bytes_ = bytes;
  return true;
}

void MemoryBudget::Lease::hold(std::size_t bytes) {
  if (budget_ == nullptr || bytes == bytes_) return;
  if (bytes > bytes_) {
    budget_->used_.fetch_add(bytes - bytes_, std::memory_order_relaxed);
  } else {
    budget_->used_.fetch_sub(bytes_ - bytes, std::memory_order_relaxed);
  }
  bytes_ = bytes;
}

std::string MemoryBudget::exhausted_message(std::size_t asked) const {
  return "the server is out of memory for requests: " + std::to_string(used()) +
         " bytes are held by requests in flight and this one needs " + std::to_string(asked) +
         " more, over the limit of " + std::to_string(limit_) +
         " bytes (--max-inflight-bytes); retry later";
}

// ---- ConnectionBudget --------------------------------------------------------------------------

bool ConnectionBudget::try_acquire(std::size_t fds) {
  std::size_t used = used_.load(std::memory_order_relaxed);
  do {
    if (capacity_ != 0 && used + fds > capacity_) return false;
  } while (!used_.compare_exchange_weak(used, used + fds, std::memory_order_relaxed));
  return true;
}

void ConnectionBudget::release(std::size_t fds) {
  used_.fetch_sub(fds, std::memory_order_relaxed);
  if (armed_.load(std::memory_order_acquire) == 0) return;
  std::lock_guard lock(mu_);
  for (auto& [id, sub] : subscribers_) {
    if (!sub.armed) continue;
    sub.armed = false;
    armed_.fetch_sub(1, std::memory_order_relaxed);
    sub.f();
  }
}

std::string ConnectionBudget::exhausted_message() const {
  return "out of file descriptors for connections (client connections hold " +
         std::to_string(used()) + " of the " + std::to_string(capacity_) +
         " the process's limit leaves them; raise it with ulimit -n)";
}

std::size_t ConnectionBudget::subscribe(std::function<void()> f) {
  std::lock_guard lock(mu_);
  subscribers_.emplace(next_id_, Subscriber{std::move(f), false});
  return next_id_++;
}

void ConnectionBudget::arm(std::size_t id) {
  std::lock_guard lock(mu_);
  auto it = subscribers_.find(id);
  if (it == subscribers_.end() || it->second.armed) return;
  it->second.armed = true;
  armed_.fetch_add(1, std::memory_order_release);
}

void ConnectionBudget::unsubscribe(std::size_t id) {
  std::lock_guard lock(mu_);
  auto it = subscribers_.find(id);
  if (it == subscribers_.end()) return;
  if (it->second.armed) armed_.fetch_sub(1, std::memory_order_relaxed);
  subscribers_.erase(it);
}

// ---- ListenerHealth ----------------------------------------------------------------------------

namespace {

/// The soft RLIMIT_NOFILE less the descriptors open now (/proc/self/fd); large when unlimited.
std::size_t free_descriptors() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return SIZE_MAX;
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;  // not even one descriptor for the listing
  std::size_t open = 0;
  while (const dirent* e = ::readdir(d)) open += e->d_name[0] != '.' ? 1 : 0;
  ::closedir(d);
  return r.rlim_cur > open ? static_cast<std::size_t>(r.rlim_cur) - open : 0;
}

}  // namespace

bool descriptors_recovered() { return free_descriptors() >= kFreeToRecover; }

ListenerHealth::~ListenerHealth() {
  std::thread watch;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    watch = std::move(watch_);
  }
  watch_cv_.notify_all();
  if (watch.joinable()) watch.join();
}

bool ListenerHealth::descriptors_failing_locked() const {
  return std::any_of(reasons_.begin(), reasons_.end(),
                     [](const auto& kv) { return kv.second.descriptors; });
}

void ListenerHealth::watch_descriptors() {
  std::unique_lock lock(mu_);
  while (!stopping_ && descriptors_failing_locked()) {
    watch_cv_.wait_for(lock, std::chrono::milliseconds(250), [this] { return stopping_; });
    if (stopping_) break;
    lock.unlock();
    const bool changed = recheck_descriptors();
    if (changed) notify();
    lock.lock();
  }
  watching_ = false;
}

bool ListenerHealth::set_failing(std::string_view listener, std::string reason, bool descriptors) {
  bool changed = false;
  {
    std::lock_guard lock(mu_);
    if (descriptors && !watching_ && !stopping_) {
      // The previous watch has ended (watching_ false): join it before starting the next.
      if (watch_.joinable()) watch_.join();
      watching_ = true;
      watch_ = std::thread([this] { watch_descriptors(); });
    }
    auto it = reasons_.find(listener);
    if (it == reasons_.end()) {
      reasons_.emplace(std::string(listener), Failure{std::move(reason), descriptors});
      failing_.fetch_add(1, std::memory_order_release);
      changed = true;
    } else {
      it->second = Failure{std::move(reason), descriptors};
    }
  }
  if (changed) notify();
  return changed;
}

bool ListenerHealth::recheck_descriptors() {
  if (all_accepting()) return false;  // the common case: no lock
  bool changed = false;
  {
    std::lock_guard lock(mu_);
    bool any = false;
    for (const auto& [name, f] : reasons_) any = any || f.descriptors;
    if (!any || !descriptors_recovered()) return false;
    for (auto it = reasons_.begin(); it != reasons_.end();) {
      if (it->second.descriptors) {
        it = reasons_.erase(it);
        failing_.fetch_sub(1, std::memory_order_release);
        changed = true;
      } else {
        ++it;
      }
    }
  }
  // No notify(): this runs inside readiness queries, which the observers make themselves (the
  // gRPC health service, under its own lock). InferenceServer::ready() tells its own readiness
  // observers of the change, unless the one asking is such an observer (ready_unannounced).
  return changed;
}

bool ListenerHealth::set_accepting(std::string_view listener) {
  if (all_accepting()) return false;  // the common case: no lock
  bool changed = false;
  {
    std::lock_guard lock(mu_);
    auto it = reasons_.find(listener);
    if (it != reasons_.end()) {
      reasons_.erase(it);
      failing_.fetch_sub(1, std::memory_order_release);
      changed = true;
    }
  }
  if (changed) notify();
  return changed;
}

std::string ListenerHealth::reasons() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, why] : reasons_) {
    if (!out.empty()) out += "; ";
    out += name + ": " + why.reason;
  }
  return out;
}

std::size_t ListenerHealth::on_change(std::function<void()> f) {
  return observers_.add(std::move(f));
}

void ListenerHealth::remove_observer(std::size_t id) { observers_.remove(id); }

void ListenerHealth::notify() { observers_.notify(); }

// ---- SpareDescriptor ---------------------------------------------------------------------------

SpareDescriptor::SpareDescriptor() : fd_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

SpareDescriptor::~SpareDescriptor() {
  if (fd_ >= 0) ::close(fd_);
}

SpareDescriptor::Shed SpareDescriptor::shed_one(int listen_fd) {
  if (fd_ < 0) fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // lost at an earlier shed
  if (fd_ < 0) return Shed::no_spare;
  ::close(fd_);
  const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (c >= 0) ::close(c);
  fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (c < 0) return Shed::none_waiting;
  return fd_ >= 0 ? Shed::shed : Shed::no_spare;
}

bool accept_out_of_resources(int error_number) {
  return error_number == EMFILE || error_number == ENFILE || error_number == ENOBUFS ||
         error_number == ENOMEM;
}

}  // namespace asyncinfer::server
