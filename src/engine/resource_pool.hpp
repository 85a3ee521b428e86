// resource_pool.hpp (internal) — the resources of a model server's rate limiter, shared by every
// model, and the ExecutionGate (execution_gate.hpp) each model's engine passes before a batch.
//
// After Triton's rate limiter (docs/user_guide/rate_limiter.md; `--rate-limit=execution_count`,
// `--rate-limit-resource=<name>:<count>[:<device>]`, instance_group `rate_limiter { resources
// priority }`):
//
// - A resource is a name and a count of copies, per device, or one count for the whole server
//   when an instance group says `global: true`. A model instance runs a batch only when every
//   resource its group lists has that many copies free; it holds them while the batch runs.
// - Counts: what the operator gave (a count for the device, else one for every device; for a
//   global resource the device is ignored); a resource the operator named only for other devices
//   has 0 here; one never named has the largest count any loaded instance asks for (so that one
//   of the largest can always run, and nothing more). Adding a model that asks for more than a
//   given count, or that lists a name as global where a loaded model (or itself) lists it per
//   device or the reverse, is refused with Triton's message.
// - Order (Triton: "an instance with priority 2 will be given 1/2 the number of scheduling
//   chances as an instance with priority 1"): stride scheduling. Each instance has a pass; a
//   grant advances it by the instance's priority (0 counts as 1). Waiters are served in the order
//   (pass, priority, arrival); an instance that starts waiting after an idle spell has its pass
//   raised to that of the last grant, so idleness earns no burst. A waiter whose resources are
//   not free blocks every later waiter that shares one of its resources (a large request is never
//   overtaken forever by small ones); later waiters on other resources go ahead. Nobody starves:
//   every grant moves the grantee's pass past the waiters it overtook.
// - The instance that gives its resources back competes for them too (Triton's instance is back
//   in the rate limiter's queue as soon as its model has more work): when others wait, a release
//   puts the releasing instance in line as if it waited already, and when it comes first the
//   resources stay reserved for its next acquire() for up to kComebackHold. Without that, two
//   models that always have work would only alternate, whatever their priorities. A reservation
//   nobody claims in time is given back (the waiters' timed waits expire it), and the instance's
//   pass is restored.
//
// Threads: every method is thread-safe; one mutex guards the pool, held only for bookkeeping
// (never while a model runs nor while a caller is blocked). Waiters block on one condition
// variable that also watches their stop token (BS::thread_pool's idiom), so a stopped engine's
// worker leaves at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "asyncinfer/execution_gate.hpp"
#include "asyncinfer/status.hpp"

namespace asyncinfer::detail {

/// One resource an instance group asks for (Triton's ModelRateLimiter.Resource).
struct ResourceNeed {
  std::string name;
  std::uint32_t count = 0;
  bool global = false;
};

/// One model instance's rate-limiter settings: its instance group's resources and priority.
struct InstanceNeeds {
  std::vector<ResourceNeed> resources;
  std::uint32_t priority = 0;  ///< Triton's weight: 2 gets half the chances of 1; 0 counts as 1
};

/// A count the operator gave (--rate-limit-resource=name:count[:device]); no device: every one.
struct ResourceLimit {
  std::string name;
  std::uint32_t count = 0;
  std::optional<int> device;
};

class ResourcePool : public std::enable_shared_from_this<ResourcePool> {
 public:
  /// The device number of global resources in slot().
  static constexpr int kGlobal = -1;
  /// How long resources stay reserved for the instance that released them (see the header).
  static constexpr std::chrono::microseconds kComebackHold{2000};

  /// A pool with the operator's counts. Make it with std::make_shared (add_model shares it).
  explicit ResourcePool(std::vector<ResourceLimit> limits);
  ResourcePool(const ResourcePool&) = delete;
  ResourcePool& operator=(const ResourcePool&) = delete;
  ~ResourcePool();

  /// Adds the instances of one model (`instances[i]` is engine worker i's, all on device
  /// `device`) and returns the gate their engine passes; the gate removes them when destroyed
  /// (the model unloaded), which may shrink the default counts. invalid_argument, with Triton's
  /// message, when an instance asks for more than a given count or a name is both global and per
  /// device among the loaded models; nothing is added then. Thread-safe.
  Result<std::shared_ptr<ExecutionGate>> add_model(std::string_view model, int device,
                                                   std::vector<InstanceNeeds> instances);

  /// What a resource holds now: its count and the copies in use, those reserved for a comeback
  /// included until kComebackHold has passed. `device` kGlobal for a global one. nullopt when no
  /// loaded instance lists it. Thread-safe (for tests and logs).
  struct SlotView {
    std::int64_t count = 0;
    std::int64_t in_use = 0;
  };
  std::optional<SlotView> slot(std::string_view name, int device) const;
  /// Instances waiting for their resources now. Thread-safe.
  std::size_t waiting() const;

 private:
  class Gate;
  using Key = std::pair<std::string, int>;  // name, device (kGlobal: global)
  struct Slot {
    std::optional<std::int64_t> given;  // the operator's count
    std::multiset<std::uint32_t> asks;  // one per loaded instance that lists it
    std::int64_t count = 0;             // given, else the largest ask
    std::int64_t in_use = 0;
  };
  struct Instance {
    std::vector<std::pair<Slot*, std::int64_t>> needs;  // stable: std::map nodes
    std::uint64_t weight = 1;
    std::uint64_t pass = 0;
    bool waiting = false;                   // its acquire() is in line
    bool reserved = false;                  // its resources are kept for its comeback
    std::uint64_t pass_before_reserve = 0;  // restored when the reservation expires
    std::chrono::steady_clock::time_point reserved_until{};
  };
  struct Waiter {
    Instance* instance = nullptr;
    std::uint64_t pass = 0;
    std::uint64_t weight = 1;
    std::uint64_t arrival = 0;
    bool granted = false;
  };
  struct WaiterOrder {
    bool operator()(const Waiter* a, const Waiter* b) const noexcept {
      if (a->pass != b->pass) return a->pass < b->pass;
      if (a->weight != b->weight) return a->weight < b->weight;
      return a->arrival < b->arrival;
    }
  };

  std::optional<std::int64_t> given_count(const std::string& name, int device) const;
  bool acquire(Instance& instance, const std::stop_token& stop);
  void release(Instance& instance) noexcept;
  void remove(std::vector<std::unique_ptr<Instance>>& instances) noexcept;
  /// Grants free resources to waiters in order; true when any was granted. Under mu_.
  bool grant_locked();
  bool fits_locked(const Instance& instance) const;
  void take_locked(Instance& instance);
  void give_back_locked(Instance& instance);
  /// Gives back the reservations not claimed by `now`; true when that granted anything. Under
  /// mu_.
  bool expire_locked(std::chrono::steady_clock::time_point now);

  const std::vector<ResourceLimit> limits_;
  mutable std::mutex mu_;
  std::condition_variable_any cv_;
  std::map<Key, Slot> slots_;               // under mu_
  std::set<Waiter*, WaiterOrder> waiting_;  // under mu_
  std::uint64_t arrivals_ = 0;              // under mu_
  std::uint64_t last_pass_ = 0;             // under mu_: the pass of the last grant
  std::vector<Instance*> reserved_;         // under mu_: instances with a reservation
};

}  // namespace asyncinfer::detail
