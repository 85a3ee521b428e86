#include "engine/ordered_delivery.hpp"

#include <algorithm>
#include <utility>

namespace asyncinfer::detail {

std::uint64_t OrderedDelivery::assign(const std::string& key) {
  std::lock_guard lock(mu_);
  return keys_[key].next_assign++;
}

bool OrderedDelivery::add(const std::shared_ptr<Request>& r, Result<Outputs>&& result) {
  std::lock_guard lock(mu_);
  Key& q = keys_[r->sequence_key];
  q.ready.emplace(r->order_seq, Pending{r, std::move(result)});
  if (q.draining) return false;
  q.draining = true;
  return true;
}

std::vector<Pending> OrderedDelivery::take_ready(const std::string& key) {
  std::vector<Pending> run;
  std::lock_guard lock(mu_);
  Key& q = keys_[key];
  while (!q.ready.empty() && q.ready.begin()->first == q.next_deliver) {
    run.push_back(std::move(q.ready.begin()->second));
    q.ready.erase(q.ready.begin());
    ++q.next_deliver;
  }
  if (run.empty()) {
    q.draining = false;
    if (q.ready.empty() && q.next_assign == q.next_deliver) keys_.erase(key);
  }
  return run;
}

void OrderedDelivery::backlog(std::int64_t& total, std::map<std::string, std::int64_t>& top,
                              std::size_t max_keys) const {
  std::vector<std::pair<std::int64_t, const std::string*>> keys;
  std::lock_guard lock(mu_);
  for (const auto& [key, q] : keys_) {
    const auto n = static_cast<std::int64_t>(q.next_assign - q.next_deliver);
    total += n;
    if (n > 0) keys.emplace_back(n, &key);
  }
  if (keys.size() > max_keys) {
    std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(max_keys), keys.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    keys.resize(max_keys);
  }
  for (const auto& [n, key] : keys) top.emplace(*key, n);
}

}  // namespace asyncinfer::detail
