// sample.h — text generation from a byte-level GPT2, for the sample a lab prints at the end of a run.
// Tests: tests/common/model/test_gpt2.cpp (sampling)
#pragma once

#include <string>

#include "scalelab/model/gpt2.h"  // defines: GPT2
#include "scalelab/core/rng.h"    // defines: Rng

namespace scalelab {

// Generates n bytes after `prompt` by sampling from the model's softmax (temperature 1), one forward
// pass per byte over the last max_seq_len tokens. The model must use the byte tokenizer (token =
// byte value, vocab 256). Bytes outside printable ASCII (other than newline) come back as '?', so the
// text is safe for a terminal and for the UTF-8 JSON log. Works for a model on any device. Allocates
// once per call (every forward runs on the longest context, padded: sample.cpp), not per byte.
std::string sample_text(GPT2& model, const std::string& prompt, int n, Rng& rng);

}  // namespace scalelab
