// tokenizer.h — the byte-level tokenizer: token = byte value, vocabulary 256. Every text round-trips
// exactly. The corpus (tools/make_shards.cpp) is tokenized with it; a sample decodes with it.
// Implementation: common/src/data/tokenizer.cpp   Tests: tests/common/data/test_shards.cpp
#pragma once

#include <cstdint>  // defines: int32_t
#include <string>
#include <vector>

namespace scalelab::data {

inline constexpr int kByteVocab = 256;  // vocabulary of the byte-level tokenizer

std::vector<int32_t> encode_bytes(const std::string& text);    // one token per byte, in [0, 256)
std::string decode_bytes(const std::vector<int32_t>& tokens);  // throws if a token is outside [0, 256)

}  // namespace scalelab::data
