// Rng: xoshiro256** seeded through splitmix64. Small, fast, and its whole state is four
// integers, saved in checkpoints so a resumed run draws the same numbers.
//
// Streams: Rng(seed, stream) gives independent sequences for independent purposes
// (initialisation, data order, sampling) from one job seed.
// Thread-safety: not thread-safe; one Rng per user.
#pragma once

#include <array>
#include <cstdint>

namespace loom {

class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0);

  uint64_t next_u64();
  // Uniform in [0, 1) with 24 random bits.
  float uniform();
  // Uniform integer in [0, n). REQUIRES: n > 0.
  uint64_t below(uint64_t n);
  // Standard normal (Box-Muller in double; one value per two draws, so state() is the
  // whole state).
  double normal();

  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_;
};

}  // namespace loom
