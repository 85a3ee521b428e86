// detail/unique_function.hpp — a move-only type-erased callable (C++23's std::move_only_function,
// which C++20 lacks).
//
// Design: callables up to kInlineSize bytes that are nothrow-move-constructible live inline (no
// allocation: the common completion lambda capturing a pointer or two); larger ones go to the
// heap. Move-only so it can hold promises and other move-only state; std::function cannot.
// Invoking an empty UniqueFunction is a programming error and aborts.
//
// Thread safety: none of its own; like any value, one object is used by one thread at a time.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

#include "asyncinfer/status.hpp"

namespace asyncinfer::detail {

template <class Signature>
class UniqueFunction;

template <class R, class... Args>
class UniqueFunction<R(Args...)> {
 public:
  static constexpr std::size_t kInlineSize = 48;

  UniqueFunction() noexcept = default;
  UniqueFunction(std::nullptr_t) noexcept {}  // NOLINT: implicit, like std::function

  template <class F, class D = std::decay_t<F>,
            class = std::enable_if_t<!std::is_same_v<D, UniqueFunction> &&
                                     std::is_invocable_r_v<R, D&, Args...>>>
  UniqueFunction(F&& f) {  // NOLINT: implicit, like std::function
    if constexpr (sizeof(D) <= kInlineSize && alignof(D) <= alignof(std::max_align_t) &&
                  std::is_nothrow_move_constructible_v<D>) {
      ::new (static_cast<void*>(storage_)) D(std::forward<F>(f));
      ops_ = &inline_ops<D>;
    } else {
      *reinterpret_cast<D**>(storage_) = new D(std::forward<F>(f));
      ops_ = &heap_ops<D>;
    }
  }

  UniqueFunction(UniqueFunction&& other) noexcept { move_from(other); }
  UniqueFunction& operator=(UniqueFunction&& other) noexcept {
    if (this != &other) {
      reset();
      move_from(other);
    }
    return *this;
  }
  UniqueFunction& operator=(std::nullptr_t) noexcept {
    reset();
    return *this;
  }
  UniqueFunction(const UniqueFunction&) = delete;
  UniqueFunction& operator=(const UniqueFunction&) = delete;
  ~UniqueFunction() { reset(); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }

  R operator()(Args... args) {
    ASYNCINFER_CHECK(ops_ != nullptr);
    return ops_->invoke(storage_, std::forward<Args>(args)...);
  }

 private:
  struct Ops {
    R (*invoke)(void*, Args&&...);
    void (*move)(void* dst, void* src) noexcept;  // move-constructs into dst, destroys src
    void (*destroy)(void*) noexcept;
  };

  template <class D>
  static constexpr Ops inline_ops = {
      [](void* s, Args&&... a) -> R {
        return (*std::launder(static_cast<D*>(s)))(std::forward<Args>(a)...);
      },
      [](void* dst, void* src) noexcept {
        D* from = std::launder(static_cast<D*>(src));
        ::new (dst) D(std::move(*from));
        from->~D();
      },
      [](void* s) noexcept { std::launder(static_cast<D*>(s))->~D(); },
  };

  template <class D>
  static constexpr Ops heap_ops = {
      [](void* s, Args&&... a) -> R { return (**static_cast<D**>(s))(std::forward<Args>(a)...); },
      [](void* dst, void* src) noexcept {
        *static_cast<D**>(dst) = *static_cast<D**>(src);
        *static_cast<D**>(src) = nullptr;
      },
      [](void* s) noexcept { delete *static_cast<D**>(s); },
  };

  void move_from(UniqueFunction& other) noexcept {
    if (other.ops_ != nullptr) {
      other.ops_->move(storage_, other.storage_);
      ops_ = other.ops_;
      other.ops_ = nullptr;
    }
  }
  void reset() noexcept {
    if (ops_ != nullptr) {
      const Ops* ops = ops_;
      ops_ = nullptr;
      ops->destroy(storage_);
    }
  }

  alignas(std::max_align_t) unsigned char storage_[kInlineSize];
  const Ops* ops_ = nullptr;
};

}  // namespace asyncinfer::detail
