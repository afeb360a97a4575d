// little_endian.h — unsigned integers stored in and loaded from n_bytes little-endian bytes, independent
// of the host's byte order: the shard format and the loader state record (common/src/data/*.cpp) only.
#pragma once

#include <cstdint>  // defines: uint8_t, uint64_t

namespace scalelab::data::detail {

inline void store_le(uint8_t* p, uint64_t v, int n_bytes) {
  for (int i = 0; i < n_bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

inline uint64_t load_le(const uint8_t* p, int n_bytes) {
  uint64_t v = 0;
  for (int i = 0; i < n_bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace scalelab::data::detail
