// rng.h — a small deterministic random generator (xoshiro256**, Blackman & Vigna 2018) whose whole
// state is four 64-bit words, so checkpoints can save and restore it exactly.
#pragma once

#include <array>
#include <cstdint>

namespace scalelab {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed);  // splitmix64 expands the seed into the state
  uint64_t next_u64();
  float uniform();  // [0, 1), 24 random bits
  float normal();   // N(0, 1), Box-Muller (no cached second value: state is the 4 words)
  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_{};
};

}  // namespace scalelab
