// lab08_support.h — what lab 08's graded checks share (tests/lab08/test_lab08*.cpp): checkpoint directories
// made here, complete or damaged, and the orderings of complete and incomplete checkpoints that the
// retention and checkpoint-choice checks enumerate. Implementation: lab08_support.cpp.
// Lesson: labs/08_resilience/README.md ("Retention", "Which one to load").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace scalelab::lab08_test {

// A checkpoint directory of `step` under root: one shard of 4096 bytes, its manifest (world size 1) and,
// when `marker`, the completion marker.
void make_checkpoint(const std::string& root, int64_t step, bool marker);

// The steps of root's checkpoint directories, newest first, space-separated: "6 5 4".
std::string steps_left(const std::string& root);

// One ordering: checkpoints of steps 1..n, step s complete when bit s - 1 of `complete` is set. An
// incomplete one is damaged one of two ways, alternately, so a rule that looks at one file only misses
// half of them: an odd step has no marker, an even step has its marker and a shard cut short.
struct Ordering {
  int n = 0;
  unsigned complete = 0;
  bool is_complete(int step) const { return (complete >> (step - 1)) & 1u; }
  std::string describe() const;  // "complete 1 2 4, incomplete 3 (shard cut short) 5 (no marker)"
};

// Every ordering of n checkpoints: 2^n of them.
std::vector<Ordering> all_orderings(int n);

// Writes the ordering's checkpoints into root (which must exist and be empty).
void make_ordering(const std::string& root, const Ordering& o);

// What retention must leave, from the rule as the README states it and computed without walking the
// directories: a step survives when it is newer than every complete one (it may be being written), or when
// it is complete and at most keep_last complete steps are >= it. Newest first, as steps_left.
std::string retained_steps(const Ordering& o, int keep_last);

// The step newest_complete_checkpoint must choose (-1: none) and the steps it must report skipped, newest
// first: every step newer than the choice (all of them are incomplete).
int64_t chosen_step(const Ordering& o);
std::vector<int64_t> skipped_steps(const Ordering& o);

}  // namespace scalelab::lab08_test
