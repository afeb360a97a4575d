// sample.cpp — sampling text from a byte-level GPT2 (sample.h).
#include "scalelab/model/sample.h"

#include <algorithm>  // defines: std::max, std::min
#include <cmath>      // defines: std::exp
#include <vector>

#include "scalelab/core/error.h"

namespace scalelab {

std::string sample_text(GPT2& model, const std::string& prompt, int n, Rng& rng) {
  SL_CHECK_HINT(model.shard().tp_size == 1 && model.shard().has_embedding && model.shard().has_head,
                "sampling needs the whole model on one rank (a shard's logits are a slice of the vocabulary, or on "
                "another stage): use --sample-tokens 0",
                "sample_text on a shard (%s)", model.shard().str().c_str());
  const int maxT = model.config().max_seq_len, V = model.config().vocab_size;
  SL_CHECK_HINT(V >= 256, "sample_text is for the byte tokenizer (scripts/prepare_corpus.sh)",
                "vocab_size %d < 256: tokens are not bytes", V);
  std::vector<int32_t> ctx;  // token = byte value
  for (unsigned char c : prompt) ctx.push_back(c);
  std::string out;
  for (int i = 0; i < n; ++i) {
    const int T = static_cast<int>(std::min<size_t>(ctx.size(), maxT));
    Tensor h_x = Tensor::empty({1, T}, DType::I32);
    std::copy(ctx.end() - T, ctx.end(), h_x.data<int32_t>());
    Tensor x = Tensor::empty({1, T}, DType::I32, model.device());
    x.copy_from(h_x);
    model.forward(x, nullptr);
    Tensor h_logits = Tensor::empty({V});  // the last position's logits (V,), on the host
    h_logits.copy_from(model.logits().view(static_cast<int64_t>(T - 1) * V, {V}));
    const float* logits = h_logits.data<float>();
    // softmax sampling: draw r in [0, sum exp) and walk the cumulative sum
    float maxv = logits[0];
    for (int v = 1; v < V; ++v) maxv = std::max(maxv, logits[v]);
    double sum = 0.0;
    for (int v = 0; v < V; ++v) sum += std::exp(logits[v] - maxv);
    const double r = rng.uniform() * sum;
    double acc = 0.0;
    int next = V - 1;
    for (int v = 0; v < V; ++v) {
      acc += std::exp(logits[v] - maxv);
      if (acc > r) {
        next = v;
        break;
      }
    }
    ctx.push_back(next);
    const bool printable = next == '\n' || (next >= 32 && next <= 126);
    out += printable ? static_cast<char>(next) : '?';
  }
  return out;
}

}  // namespace scalelab
