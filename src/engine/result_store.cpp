#include "engine/result_store.hpp"

namespace asyncinfer::detail {

void ResultStore::bury(const std::string& id, std::string reason) {
  if (tombstones_.insert_or_assign(id, std::move(reason)).second) tombstone_order_.push_back(id);
  while (tombstone_order_.size() > capacity_) {
    tombstones_.erase(tombstone_order_.front());
    tombstone_order_.pop_front();
  }
}

void ResultStore::purge_expired(Clock::time_point now) {
  while (!finished_.empty()) {
    auto it = entries_.find(finished_.front());
    if (it == entries_.end()) {  // defensive: keep the list consistent
      finished_.pop_front();
      continue;
    }
    if (now - it->second.finished_at < ttl_ticks_) break;
    std::string id = finished_.front();
    finished_.pop_front();
    entries_.erase(it);
    bury(id, "expired: its result was kept for the TTL of " + std::to_string(ttl_.count()) +
                 " ms after it finished");
  }
}

Status ResultStore::insert(const std::shared_ptr<Request>& r) {
  std::lock_guard lock(mu_);
  purge_expired(Clock::now());
  auto it = entries_.find(r->id);
  if (it != entries_.end()) {
    if (!it->second.finished) {
      return already_exists_error("request id '" + r->id + "' is already " +
                                  std::string(to_string(to_state(
                                      it->second.request->stage.load(std::memory_order_acquire)))));
    }
    finished_.erase(it->second.finished_pos);  // a finished id may be reused
    entries_.erase(it);
  }
  if (entries_.size() >= capacity_) {
    if (finished_.empty()) {
      return resource_exhausted_error("result store full: all " + std::to_string(capacity_) +
                                      " entries are pending or running requests");
    }
    std::string oldest = finished_.front();
    finished_.pop_front();
    entries_.erase(oldest);
    bury(oldest, "evicted: the result store keeps at most " + std::to_string(capacity_) +
                     " entries and newer requests needed the room");
  }
  tombstones_.erase(r->id);
  entries_.emplace(r->id, Entry{r, false, {}, {}});
  return Status();
}

void ResultStore::erase_refused(const std::string& id, const Request* r) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(id);
  if (it != entries_.end() && it->second.request.get() == r && !it->second.finished) {
    entries_.erase(it);
  }
}

void ResultStore::mark_finished(const Request& r) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(r.id);
  if (it == entries_.end() || it->second.request.get() != &r || it->second.finished) return;
  it->second.finished = true;
  it->second.finished_at = Clock::now();
  it->second.finished_pos = finished_.insert(finished_.end(), r.id);
}

Status ResultStore::not_found(std::string_view id) const {
  auto t = tombstones_.find(std::string(id));
  if (t != tombstones_.end()) {
    return not_found_error("request id '" + std::string(id) + "' " + t->second);
  }
  return not_found_error("unknown request id '" + std::string(id) + "'");
}

Result<std::shared_ptr<Request>> ResultStore::find(std::string_view id) {
  std::lock_guard lock(mu_);
  purge_expired(Clock::now());
  auto it = entries_.find(std::string(id));
  if (it == entries_.end()) return not_found(id);
  return it->second.request;
}

Status ResultStore::release(std::string_view id) {
  std::lock_guard lock(mu_);
  auto it = entries_.find(std::string(id));
  if (it == entries_.end()) return not_found(id);
  if (!it->second.finished) {
    return failed_precondition_error("request id '" + std::string(id) +
                                     "' is still pending or running; cancel it first");
  }
  finished_.erase(it->second.finished_pos);
  entries_.erase(it);
  return Status();
}

std::size_t ResultStore::size() const {
  std::lock_guard lock(mu_);
  return entries_.size();
}

}  // namespace asyncinfer::detail
