// backend_list.hpp (internal) — the shared part of the device and model backend registries
// (src/device/backend.hpp, src/model/backend.hpp): a list of entries, each known by one string
// key, that only grows.
#pragma once

#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "asyncinfer/status.hpp"

namespace asyncinfer::detail {

/// A thread-safe list of `Entry` values, unique by the string member `Key` (e.g.
/// &DeviceBackend::name). add() and snapshot() take a short lock; nothing is ever removed, and no
/// entry's code runs under the lock (callers use a snapshot).
template <class Entry, std::string Entry::*Key>
class BackendList {
 public:
  /// Appends `entry`; already_exists ("<what> '<key>' is already registered") when its key is
  /// taken. The caller checks the entry's own fields first.
  Status add(Entry entry, const char* what) {
    std::lock_guard lock(mu_);
    for (const auto& e : entries_) {
      if (e.*Key == entry.*Key) {
        return already_exists_error(std::string(what) + " '" + entry.*Key +
                                    "' is already registered");
      }
    }
    entries_.push_back(std::move(entry));
    return Status();
  }

  /// A copy of the entries, in the order they were added.
  std::vector<Entry> snapshot() const {
    std::lock_guard lock(mu_);
    return entries_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Entry> entries_;
};

}  // namespace asyncinfer::detail
