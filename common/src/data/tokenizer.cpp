// tokenizer.cpp — the byte-level tokenizer (scalelab/data/tokenizer.h).
#include "scalelab/data/tokenizer.h"

#include "scalelab/core/error.h"  // defines: SL_FAIL

namespace scalelab::data {

std::vector<int32_t> encode_bytes(const std::string& text) {
  std::vector<int32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);  // 0..255
  return tokens;
}

std::string decode_bytes(const std::vector<int32_t>& tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= kByteVocab)
      SL_FAIL("byte-level tokens are 0..255; were these tokens made by another tokenizer?",
              "token %d at index %zu is not a byte", tokens[i], i);
    text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  }
  return text;
}

}  // namespace scalelab::data
