// detail/enum_names.hpp — an enum's names in one table: what its to_string() returns and what a
// parser of its names accepts, written once, as a Transitions (transitions.hpp) holds a life
// cycle's names next to its enum.
//
// An enum whose values are 0..N-1 lists its names in order; name() is the table's entry, parse()
// the value whose name is the text:
//
//   enum class Door : std::uint8_t { open, closed };
//   inline constexpr EnumNames<Door, 2> kDoorNames{{"open", "closed"}};
//   std::string_view to_string(Door d) noexcept { return kDoorNames.name(d); }
//
// Thread safety: an EnumNames is immutable (constexpr). Nothing blocks; nothing throws.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string_view>

namespace asyncinfer::detail {

/// The names of the N values (0..N-1) of enum E.
template <class E, std::size_t N>
class EnumNames {
 public:
  /// `names[i]` names value i; `unknown` is the name of a value outside 0..N-1 (a cast of a
  /// number the enum does not define).
  constexpr EnumNames(std::array<std::string_view, N> names,
                      std::string_view unknown = "unknown") noexcept
      : names_(names), unknown_(unknown) {}

  /// The value's name; `unknown` for a value outside the table.
  constexpr std::string_view name(E e) const noexcept {
    const auto i = static_cast<std::size_t>(e);
    return i < N ? names_[i] : unknown_;
  }

  /// The value named exactly `text` (case-sensitive); nullopt for any other text.
  constexpr std::optional<E> parse(std::string_view text) const noexcept {
    for (std::size_t i = 0; i < N; ++i) {
      if (names_[i] == text) return static_cast<E>(i);
    }
    return std::nullopt;
  }

  static constexpr std::size_t size() noexcept { return N; }

 private:
  std::array<std::string_view, N> names_;
  std::string_view unknown_;
};

}  // namespace asyncinfer::detail
