// ResponseCache (response_cache.hpp): the key, the LRU, the flights of identical requests, and
// the --cache-config parser.
#include "response_cache.hpp"

#include <charconv>
#include <cstring>
#include <functional>
#include <string_view>
#include <utility>

namespace asyncinfer::server {
namespace {

/// boost::hash_combine's mixing step, widened to 64 bits.
void combine(std::uint64_t& seed, std::uint64_t v) noexcept {
  seed ^= v + 0x9e3779b97f4a7c15ULL + (seed << 12) + (seed >> 4);
}

std::uint64_t hash_bytes(const void* data, std::size_t n) {
  return std::hash<std::string_view>{}(std::string_view(static_cast<const char*>(data), n));
}

/// What an entry takes: its key twice (the list's entry and the index's), its tensors with their
/// storage and shapes, and the nodes (an estimate of the allocator's share included).
std::size_t entry_bytes(const CacheKey& key, const std::vector<Tensor>& outputs) {
  std::size_t n = 2 * (sizeof(CacheKey) + key.bytes.size()) + 192;
  for (const Tensor& t : outputs) n += t.byte_size() + sizeof(Tensor) + t.rank() * 8 + 192;
  return n;
}

}  // namespace

CacheKey response_cache_key(std::string_view model, std::int64_t version,
                            std::span<const Tensor> inputs, std::uint64_t generation) {
  CacheKey key;
  std::size_t data = 0;
  for (const Tensor& t : inputs) data += t.byte_size();
  key.bytes.reserve(model.size() + 16 + inputs.size() * 32 + data);
  key.bytes.append(model).push_back('\0');
  key.bytes.append(std::to_string(version)).push_back('\0');
  key.bytes.append(std::to_string(generation)).push_back('\0');
  for (const Tensor& t : inputs) {
    if (!t.defined()) {  // an optional input left out
      key.bytes.push_back('-');
      continue;
    }
    key.bytes.append(to_string(t.dtype())).push_back('[');
    for (std::int64_t d : t.shape()) key.bytes.append(std::to_string(d)).push_back(',');
    key.bytes.push_back(']');
  }
  const std::size_t meta = key.bytes.size();
  for (const Tensor& t : inputs) {
    if (t.byte_size() == 0) continue;
    key.bytes.append(static_cast<const char*>(t.data()), t.byte_size());
  }
  std::uint64_t h = hash_bytes(key.bytes.data(), meta);
  combine(h, hash_bytes(key.bytes.data() + meta, key.bytes.size() - meta));
  key.hash = h;
  return key;
}

ResponseCache::ResponseCache(std::size_t capacity_bytes) : capacity_(capacity_bytes) {}

ResponseCache::Lookup ResponseCache::lookup(const CacheKey& key, bool join, Waiter& waiter) {
  Lookup out;
  std::lock_guard lock(mu_);
  if (auto it = index_.find(key); it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    out.role = Role::hit;
    out.outputs = it->second->outputs;
    return out;
  }
  if (!join) return out;  // alone
  auto [flight, created] = flights_.try_emplace(key);
  if (created) {
    out.role = Role::leader;
    return out;
  }
  out.role = Role::follower;
  out.ticket = next_ticket_++;
  flight->second.followers.emplace_back(out.ticket, std::move(waiter));
  return out;
}

std::vector<ResponseCache::Waiter> ResponseCache::finish(
    const CacheKey& key, bool led, const Result<std::vector<Tensor>>& result) {
  // The copy is made outside the lock: the engine's outputs may be views of memory it reuses
  // (an identity model's output is its input, which may be a frontend's receive buffer). An
  // answer that could never fit is not copied at all.
  std::vector<Tensor> copy;
  bool keep = result.ok() && entry_bytes(key, *result) <= capacity_;
  if (keep) {
    copy.reserve(result->size());
    for (const Tensor& t : *result) {
      Result<Tensor> c = t.clone();
      if (!c.ok()) {
        keep = false;  // not host memory: not cached
        break;
      }
      copy.push_back(std::move(*c));
    }
  }
  std::vector<Waiter> followers;
  {
    std::lock_guard lock(mu_);
    if (keep) insert_locked(key, std::move(copy));
    if (led) {
      if (auto it = flights_.find(key); it != flights_.end()) {
        followers.reserve(it->second.followers.size());
        for (auto& [ticket, w] : it->second.followers) followers.push_back(std::move(w));
        flights_.erase(it);
      }
    }
  }
  return followers;
}

bool ResponseCache::withdraw(const CacheKey& key, std::uint64_t ticket) {
  Waiter removed;
  std::lock_guard lock(mu_);
  auto it = flights_.find(key);
  if (it == flights_.end()) return false;
  auto& f = it->second.followers;
  for (auto w = f.begin(); w != f.end(); ++w) {
    if (w->first == ticket) {
      removed = std::move(w->second);
      f.erase(w);
      return true;
    }
  }
  return false;
}

void ResponseCache::insert_locked(const CacheKey& key, std::vector<Tensor> outputs) {
  if (index_.contains(key)) return;  // a lone request computed it too
  const std::size_t bytes = entry_bytes(key, outputs);
  if (bytes > capacity_) return;
  while (bytes_ + bytes > capacity_ && !lru_.empty()) {
    Entry& last = lru_.back();
    bytes_ -= last.bytes;
    index_.erase(last.key);
    lru_.pop_back();
    evictions_.fetch_add(1, std::memory_order_relaxed);
  }
  lru_.push_front(Entry{key, std::move(outputs), bytes});
  index_.emplace(key, lru_.begin());
  bytes_ += bytes;
}

std::size_t ResponseCache::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

std::size_t ResponseCache::entries() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

Result<std::size_t> parse_cache_config(std::span<const std::string> values) {
  std::size_t size = 0;
  for (const std::string& v : values) {
    const std::size_t comma = v.find(',');
    const std::string_view cache = std::string_view(v).substr(0, comma);
    if (cache != "local") {
      return invalid_argument_error(
          "--cache-config '" + v + "': cache '" + std::string(cache) +
          "' is not built in (expected local,size=BYTES: the in-process LRU cache)");
    }
    if (comma == std::string::npos) {
      return invalid_argument_error("--cache-config '" + v + "': expected local,size=BYTES");
    }
    const std::string_view setting = std::string_view(v).substr(comma + 1);
    if (setting.find(',') != std::string_view::npos) {
      return invalid_argument_error("--cache-config '" + v +
                                    "': the local cache takes one setting, size=BYTES");
    }
    const std::size_t eq = setting.find('=');
    if (eq == std::string_view::npos || setting.substr(0, eq) != "size") {
      return invalid_argument_error("--cache-config '" + v +
                                    "': the local cache takes size=BYTES (got '" +
                                    std::string(setting) + "')");
    }
    const std::string_view number = setting.substr(eq + 1);
    std::uint64_t n = 0;
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), n);
    if (ec != std::errc() || end != number.data() + number.size() || n == 0) {
      return invalid_argument_error("--cache-config '" + v +
                                    "': size must be a positive number of bytes (got '" +
                                    std::string(number) + "')");
    }
    size = static_cast<std::size_t>(n);
  }
  return size;
}

}  // namespace asyncinfer::server
