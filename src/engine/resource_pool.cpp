// The rate limiter's resource pool and its per-model gate (resource_pool.hpp).
#include "engine/resource_pool.hpp"

#include <algorithm>
#include <climits>

namespace asyncinfer::detail {

/// One model's gate: engine worker i passes instances_[i]'s needs; a worker the model did not
/// list (more workers than instances were planned) needs nothing.
class ResourcePool::Gate final : public ExecutionGate {
 public:
  Gate(std::shared_ptr<ResourcePool> pool, std::vector<std::unique_ptr<Instance>> instances)
      : pool_(std::move(pool)), instances_(std::move(instances)) {}
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  ~Gate() override { pool_->remove(instances_); }

  bool acquire(int worker, std::stop_token stop) override {
    Instance* i = find(worker);
    return i == nullptr || pool_->acquire(*i, stop);
  }
  void release(int worker) noexcept override {
    if (Instance* i = find(worker); i != nullptr) pool_->release(*i);
  }

 private:
  Instance* find(int worker) const noexcept {
    if (worker < 0 || static_cast<std::size_t>(worker) >= instances_.size()) return nullptr;
    Instance* i = instances_[static_cast<std::size_t>(worker)].get();
    return i->needs.empty() ? nullptr : i;
  }

  const std::shared_ptr<ResourcePool> pool_;
  std::vector<std::unique_ptr<Instance>> instances_;
};

ResourcePool::ResourcePool(std::vector<ResourceLimit> limits) : limits_(std::move(limits)) {}

ResourcePool::~ResourcePool() = default;

std::optional<std::int64_t> ResourcePool::given_count(const std::string& name, int device) const {
  // Triton's rules (resource_pool.hpp): a count for this device, else one for every device; a
  // global resource takes any count given for its name; a name given only for other devices
  // has none here. The last one given wins, as a repeated flag does.
  std::optional<std::int64_t> exact;
  std::optional<std::int64_t> every;
  bool named = false;
  for (const ResourceLimit& l : limits_) {
    if (l.name != name) continue;
    named = true;
    if (device == kGlobal || !l.device) {
      every = l.count;
    } else if (*l.device == device) {
      exact = l.count;
    }
  }
  if (exact) return exact;
  if (every) return every;
  if (named) return 0;
  return std::nullopt;
}

Result<std::shared_ptr<ExecutionGate>> ResourcePool::add_model(
    std::string_view model, int device, std::vector<InstanceNeeds> instances) {
  std::lock_guard lock(mu_);
  // Names this model lists, by kind, and its largest ask per resource.
  std::map<Key, std::int64_t> largest;
  std::set<std::string> global_names;
  std::set<std::string> device_names;
  for (const InstanceNeeds& inst : instances) {
    for (const ResourceNeed& r : inst.resources) {
      const Key key{r.name, r.global ? kGlobal : device};
      std::int64_t& l = largest[key];
      l = std::max<std::int64_t>(l, r.count);
      (r.global ? global_names : device_names).insert(r.name);
    }
  }
  auto listed = [this](const std::string& name, bool global) {
    for (auto it = slots_.lower_bound(Key{name, INT_MIN});
         it != slots_.end() && it->first.first == name; ++it) {
      if ((it->first.second == kGlobal) == global && !it->second.asks.empty()) return true;
    }
    return false;
  };
  for (const auto& [key, count] : largest) {
    const std::string& name = key.first;
    const bool global = key.second == kGlobal;
    if ((global ? device_names : global_names).count(name) != 0 || listed(name, !global)) {
      return invalid_argument_error("Resource \"" + name +
                                    "\" is present as both global and device-specific resource "
                                    "in the model configuration.");
    }
    const auto it = slots_.find(key);
    const std::optional<std::int64_t> given =
        it != slots_.end() ? it->second.given : given_count(name, key.second);
    if (given && *given < count) {
      return invalid_argument_error(
          "Resource count for \"" + name + "\" is limited to " + std::to_string(*given) +
          " which will prevent scheduling of one or more model instances, the minimum required "
          "count is " +
          std::to_string(count) + " (model '" + std::string(model) + "')");
    }
  }
  // Checked: add them.
  std::vector<std::unique_ptr<Instance>> added;
  added.reserve(instances.size());
  for (const InstanceNeeds& inst : instances) {
    auto i = std::make_unique<Instance>();
    i->weight = std::max<std::uint64_t>(1, inst.priority);
    i->pass = last_pass_;
    for (const ResourceNeed& r : inst.resources) {
      const Key key{r.name, r.global ? kGlobal : device};
      auto [it, fresh] = slots_.try_emplace(key);
      Slot& s = it->second;
      if (fresh) s.given = given_count(key.first, key.second);
      s.asks.insert(r.count);
      s.count = s.given ? *s.given : static_cast<std::int64_t>(*s.asks.rbegin());
      i->needs.emplace_back(&s, static_cast<std::int64_t>(r.count));
    }
    added.push_back(std::move(i));
  }
  return std::shared_ptr<ExecutionGate>(
      std::make_shared<Gate>(shared_from_this(), std::move(added)));
}

void ResourcePool::remove(std::vector<std::unique_ptr<Instance>>& instances) noexcept {
  bool any = false;
  {
    std::lock_guard lock(mu_);
    for (auto& i : instances) {
      if (i->reserved) {  // the model is gone: its reservation goes back
        give_back_locked(*i);
        i->reserved = false;
        std::erase(reserved_, i.get());
        any = true;
      }
      for (auto& [slot, n] : i->needs) {
        slot->asks.erase(slot->asks.find(static_cast<std::uint32_t>(n)));
        if (!slot->given) slot->count = slot->asks.empty() ? 0 : *slot->asks.rbegin();
      }
    }
    for (auto it = slots_.begin(); it != slots_.end();) {
      if (it->second.asks.empty() && it->second.in_use == 0) {
        it = slots_.erase(it);
      } else {
        ++it;
      }
    }
    instances.clear();
    if (any) any = grant_locked();
  }
  if (any) cv_.notify_all();
}

bool ResourcePool::fits_locked(const Instance& instance) const {
  for (const auto& [slot, n] : instance.needs) {
    if (slot->in_use + n > slot->count) return false;
  }
  return true;
}

void ResourcePool::take_locked(Instance& instance) {
  for (auto& [slot, n] : instance.needs) slot->in_use += n;
}

void ResourcePool::give_back_locked(Instance& instance) {
  for (auto& [slot, n] : instance.needs) slot->in_use -= n;
}

bool ResourcePool::grant_locked() {
  bool any = false;
  std::vector<const Slot*> blocked;  // resources a waiter ahead is waiting for
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    Waiter* w = *it;
    const auto& needs = w->instance->needs;
    const bool behind = std::any_of(needs.begin(), needs.end(), [&](const auto& need) {
      return std::find(blocked.begin(), blocked.end(), need.first) != blocked.end();
    });
    if (!behind && fits_locked(*w->instance)) {
      take_locked(*w->instance);
      w->granted = true;
      w->instance->pass = w->pass + w->weight;
      last_pass_ = std::max(last_pass_, w->pass);
      it = waiting_.erase(it);
      any = true;
      continue;
    }
    for (const auto& need : needs) blocked.push_back(need.first);
    ++it;
  }
  return any;
}

bool ResourcePool::expire_locked(std::chrono::steady_clock::time_point now) {
  bool any = false;
  for (auto it = reserved_.begin(); it != reserved_.end();) {
    Instance& i = **it;
    if (i.reserved_until > now) {
      ++it;
      continue;
    }
    give_back_locked(i);
    i.reserved = false;
    i.pass = i.pass_before_reserve;  // an unused turn costs nothing
    it = reserved_.erase(it);
    any = true;
  }
  return any && grant_locked();
}

bool ResourcePool::acquire(Instance& instance, const std::stop_token& stop) {
  std::unique_lock lock(mu_);
  if (expire_locked(std::chrono::steady_clock::now())) cv_.notify_all();
  if (instance.reserved) {  // it came back in time: the resources kept for it are its
    instance.reserved = false;
    std::erase(reserved_, &instance);
    return true;
  }
  // Idleness earns no burst: a pass left behind moves up to the last grant's.
  Waiter w;
  w.instance = &instance;
  w.pass = std::max(instance.pass, last_pass_);
  w.weight = instance.weight;
  w.arrival = arrivals_++;
  waiting_.insert(&w);
  instance.waiting = true;
  if (grant_locked()) cv_.notify_all();  // others may have been granted too
  while (!w.granted && !stop.stop_requested()) {
    if (reserved_.empty()) {
      // Woken to be granted, to stop, or when a reservation appears (its expiry is then waited
      // for: the waiters give back what nobody claimed).
      cv_.wait(lock, stop, [&] { return w.granted || !reserved_.empty(); });
    } else {
      auto until = reserved_.front()->reserved_until;
      for (const Instance* i : reserved_) until = std::min(until, i->reserved_until);
      cv_.wait_until(lock, stop, until, [&] { return w.granted; });
    }
    if (!w.granted && expire_locked(std::chrono::steady_clock::now())) cv_.notify_all();
  }
  instance.waiting = false;
  if (w.granted) return true;
  // Stopped first: leave the line; those it held back may go now.
  waiting_.erase(&w);
  if (grant_locked()) cv_.notify_all();
  return false;
}

void ResourcePool::release(Instance& instance) noexcept {
  bool any = false;
  {
    std::lock_guard lock(mu_);
    give_back_locked(instance);
    const auto now = std::chrono::steady_clock::now();
    any = expire_locked(now);
    if (!waiting_.empty() && !instance.waiting && !instance.reserved) {
      // Others wait: it competes as if it waited already (header); first in line, the resources
      // are kept for its next acquire().
      Waiter comeback;
      comeback.instance = &instance;
      comeback.pass = std::max(instance.pass, last_pass_);
      comeback.weight = instance.weight;
      comeback.arrival = arrivals_++;
      const std::uint64_t pass_before = instance.pass;
      waiting_.insert(&comeback);
      any = grant_locked() || any;
      if (comeback.granted) {
        instance.reserved = true;
        instance.pass_before_reserve = pass_before;
        instance.reserved_until = now + kComebackHold;
        reserved_.push_back(&instance);
        any = true;  // the waiters time their waits by it
      } else {
        waiting_.erase(&comeback);
        any = grant_locked() || any;  // it may have held others back
      }
    } else {
      any = grant_locked() || any;
    }
  }
  if (any) cv_.notify_all();
}

std::optional<ResourcePool::SlotView> ResourcePool::slot(std::string_view name, int device) const {
  std::lock_guard lock(mu_);
  const auto it = slots_.find(Key{std::string(name), device});
  if (it == slots_.end()) return std::nullopt;
  // A reservation past its hold is given back by the next acquire() or release(); until then it
  // is held for nobody, so it is not counted as in use.
  std::int64_t in_use = it->second.in_use;
  const auto now = std::chrono::steady_clock::now();
  for (const Instance* i : reserved_) {
    if (i->reserved_until > now) continue;
    for (const auto& [s, n] : i->needs) {
      if (s == &it->second) in_use -= n;
    }
  }
  return SlotView{it->second.count, in_use};
}

std::size_t ResourcePool::waiting() const {
  std::lock_guard lock(mu_);
  return waiting_.size();
}

}  // namespace asyncinfer::detail
