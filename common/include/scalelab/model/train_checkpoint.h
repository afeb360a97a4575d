// train_checkpoint.h — a single-rank training checkpoint on top of checkpoint.h: the model's
// parameters, the optimizer's state (m, v, fp32 master, step count), the data loader's position,
// the sampling RNG and the step, so that resuming continues bit-exactly on the CPU
// (train 20 steps == train 10, save, load, train 10). Written to a temporary name and renamed only
// when complete (CheckpointWriter::commit). Tests: tests/common/model/test_train_checkpoint.cpp
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>  // defines: nlohmann::json (the meta section)

#include "scalelab/model/gpt2.h"
#include "scalelab/model/optim.h"
#include "scalelab/core/rng.h"

namespace scalelab {

struct TrainState {
  int64_t step = 0;                   // optimizer steps completed
  std::vector<uint8_t> loader_state;  // the data loader's serialised position (opaque here)
  Rng rng;                            // sampling / dropout RNG of the driver
  nlohmann::json meta;                // anything else the driver wants back (config, run id, ...)
};

// Writes <path> atomically. Throws scalelab::Error if the file cannot be written; an existing good
// checkpoint at <path> is then untouched.
void save_train_checkpoint(const std::string& path, GPT2& model, Optimizer& optimizer, const TrainState& state);

// Restores model parameters, optimizer state and returns the TrainState. Throws scalelab::Error when the
// file is damaged (checksum), partial, or was written for another model shape / optimizer / precision
// (the message says which and how to fix it); the model and optimizer are unchanged then.
TrainState load_train_checkpoint(const std::string& path, GPT2& model, Optimizer& optimizer);

}  // namespace scalelab
