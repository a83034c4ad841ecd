// A small set of flag bits (task flags, queue flags). Plain, not atomic:
// fields that change concurrently use chi::Atomic instead.
#pragma once

#include "chi/core/macros.h"  // CHI_CROSS_FUN
#include "chi/core/types.h"   // u32

namespace chi {

/** A word of flag bits with named set/test operations. */
template <typename T = u32>
struct BitField {
  T bits_ = 0;

  constexpr BitField() = default;
  CHI_CROSS_FUN constexpr explicit BitField(T bits) : bits_(bits) {}
  CHI_CROSS_FUN constexpr void SetBits(T mask) { bits_ |= mask; }
  CHI_CROSS_FUN constexpr void UnsetBits(T mask) { bits_ &= ~mask; }
  /** True when any bit of mask is set. */
  CHI_CROSS_FUN constexpr bool Any(T mask) const { return (bits_ & mask) != 0; }
  /** True when every bit of mask is set. */
  CHI_CROSS_FUN constexpr bool All(T mask) const { return (bits_ & mask) == mask; }
  CHI_CROSS_FUN constexpr void Clear() { bits_ = 0; }
  CHI_CROSS_FUN constexpr T Bits() const { return bits_; }

  template <typename Ar>
  CHI_CROSS_FUN void serialize(Ar &ar) {
    ar(bits_);
  }
};

using IntFlag = BitField<u32>;

}  // namespace chi
