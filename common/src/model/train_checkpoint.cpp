// train_checkpoint.cpp — model + optimizer + loader + RNG checkpoints (train_checkpoint.h).
// Sections: "meta" (json), "params/<unit>", "adam_m/<unit>", "adam_v/<unit>", "master/<unit>",
// "loader", "rng". Tensors are saved from their CPU copies (a GPU model is staged through the host).
#include "scalelab/model/train_checkpoint.h"

#include "scalelab/model/checkpoint.h"
#include "scalelab/core/error.h"

namespace scalelab {

static std::vector<uint8_t> tensor_bytes(const Tensor& t) {
  std::vector<uint8_t> out(t.nbytes());
  if (t.device() == Device::CPU) {
    std::copy_n(static_cast<const uint8_t*>(t.raw()), t.nbytes(), out.begin());
  } else {
    Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::CPU, MemCategory::Workspace);
    host.copy_from(t);
    std::copy_n(static_cast<const uint8_t*>(host.raw()), host.nbytes(), out.begin());
  }
  return out;
}

static void read_into(const CheckpointReader& r, const std::string& name, Tensor& t) {
  Tensor host = Tensor::empty(t.shape(), t.dtype(), Device::CPU, MemCategory::Workspace);
  r.read(name, host.raw(), host.nbytes());
  t.copy_from(host);
}

static nlohmann::json shape_meta(GPT2& model, Optimizer& opt) {
  const GPTConfig& c = model.config();
  return {{"max_seq_len", c.max_seq_len},
          {"vocab_size", c.vocab_size},
          {"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_embd", c.n_embd},
          {"precision", model.policy().name()},
          {"optimizer", opt.config().kind == OptimizerConfig::Kind::AdamW ? "adamw" : "sgd"}};
}

void save_train_checkpoint(const std::string& path, GPT2& model, Optimizer& opt, const TrainState& state) {
  CheckpointWriter w;
  nlohmann::json meta = {{"model", shape_meta(model, opt)},
                         {"step", state.step},
                         {"optimizer_step", opt.step_count()},
                         {"user", state.meta}};
  w.add_json("meta", meta);
  for (int u = 0; u < model.num_units(); ++u) {
    const std::string s = std::to_string(u);
    auto add = [&](const std::string& name, const Tensor& t) {
      if (!t.defined()) return;
      const std::vector<uint8_t> b = tensor_bytes(t);
      w.add_copy(name + "/" + s, b.data(), b.size());
    };
    add("params", model.unit_params(u));
    add("adam_m", opt.m()[u]);
    add("adam_v", opt.v()[u]);
    add("master", opt.master()[u]);
  }
  w.add_copy("loader", state.loader_state.data(), state.loader_state.size());
  const auto rng_state = state.rng.state();
  w.add_copy("rng", rng_state.data(), sizeof(rng_state));
  w.commit(path);
}

TrainState load_train_checkpoint(const std::string& path, GPT2& model, Optimizer& opt) {
  CheckpointReader r(path);  // validates magic, section table and every checksum before we touch state
  const nlohmann::json meta = r.json("meta");
  const nlohmann::json want = shape_meta(model, opt);
  SL_CHECK_HINT(meta.at("model") == want,
                "resume with the same --model, --precision and --optimizer, or start a new run without --resume",
                "checkpoint %s was written for %s, this run is %s", path.c_str(), meta.at("model").dump().c_str(),
                want.dump().c_str());
  // The reader has verified every section's checksum and the shapes match (meta above), so the reads
  // below cannot fail halfway and leave a half-restored model.
  TrainState st;
  st.step = meta.at("step").get<int64_t>();
  st.meta = meta.at("user");
  st.loader_state = r.bytes("loader");
  std::array<uint64_t, 4> rng_state{};
  r.read("rng", rng_state.data(), sizeof(rng_state));
  st.rng.set_state(rng_state);
  for (int u = 0; u < model.num_units(); ++u) {
    const std::string s = std::to_string(u);
    read_into(r, "params/" + s, model.unit_params(u));
    if (opt.m()[u].defined()) read_into(r, "adam_m/" + s, opt.m()[u]);
    if (opt.v()[u].defined()) read_into(r, "adam_v/" + s, opt.v()[u]);
    if (opt.master()[u].defined()) read_into(r, "master/" + s, opt.master()[u]);
  }
  opt.set_step_count(meta.at("optimizer_step").get<int64_t>());
  return st;
}

}  // namespace scalelab
