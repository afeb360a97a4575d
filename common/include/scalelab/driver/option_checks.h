// option_checks.h — every numeric option of every program checked, in words, before anything runs; and every
// rank of a multi-rank program started with the same options, reading the same data. One CLI11 validator per
// kind of number (a validator sees the text before CLI11 converts it, so "99999999999" for an int gets the
// same words as "0"); require_checked_options refuses a program that declares a number without one.
// Implementation: common/src/driver/option_checks.cpp. Tests: tests/robustness/bad_inputs.py.
#pragma once

#include <CLI/CLI.hpp>  // defines: CLI::App, CLI::Validator

#include <cstdint>
#include <string>
#include <vector>

#include "scalelab/comm/comm.h"  // defines: Communicator

namespace scalelab::driver {

// ---------------------------------------------------------------------------------------------
// One validator per kind: app.add_option("--steps", o.steps, "...")->check(positive_int());
// A refused value ends the parse with "--steps: 0 is out of range: a whole number from 1 to 2147483647".
// `max`: the largest value the option's type (or its meaning) takes; the default is int's.

CLI::Validator positive_int(int64_t max = INT32_MAX);       // 1, 2, ..., max
CLI::Validator non_negative_int(int64_t max = INT32_MAX);   // 0, 1, ..., max
CLI::Validator int_in_range(int64_t min, int64_t max);      // min, ..., max (e.g. a rank, -1 for none)
CLI::Validator seed_value();                                // 0 ... 2^64 - 1 (a uint64_t)
CLI::Validator finite_in_range(double min, double max,      // a finite number in [min, max], or in (min, max]
                               bool min_excluded = false);  // with min_excluded; max INFINITY: no upper bound
CLI::Validator finite_positive();                           // a finite number > 0
CLI::Validator finite_non_negative();                       // a finite number >= 0 (0 often means off)
CLI::Validator probability();                               // a number from 0 to 1

// Throws std::logic_error naming every option of `app` (and its subcommands) that takes a number but has
// none of the validators above: a program that forgot one fails at its start, in any test that runs it.
void require_checked_options(CLI::App& app);

// The largest --threads a program accepts (a thread per core is the most that helps; this is far above
// any machine's core count and keeps a typo such as 100000 from starting that many threads).
constexpr int kMaxThreads = 1024;

// A rank option (--fail-rank 1) once the world size is known: -1 is "none" when none_ok, else a rank
// index 0 <= value < world_size. Throws scalelab::Error naming the option, the value and the ranks there are.
void check_rank_option(const std::string& option, int value, int world_size, bool none_ok = true);

// A directory option (--log-dir, --checkpoint-dir) made ready for writing before the first step: created
// with its parents, then a probe file written and removed. Throws scalelab::Error naming the option, the
// path and the real cause: a part of the path that is a file, a missing parent that cannot be made, a
// read-only file system or directory (the system's own words), instead of a failure at the first save.
void check_writable_dir(const std::string& option, const std::string& dir);

// ---------------------------------------------------------------------------------------------
// Ranks agree

// The options whose values may differ from rank to rank: where a rank writes its own log, how many threads
// it runs, which CPU calibration divides its MFU, what it prints, where it leaves its heartbeat.
const std::vector<std::string>& per_rank_options();

// Every option of `app` (but --help and per_rank_options()) as "name=value" lines, sorted by name, after the
// program's description and the world size: what every rank must agree on. A value not given is the
// default; numbers are written alike however they were spelled (2e-3 and 0.002 agree).
std::vector<std::string> agreed_options(const CLI::App& app, int world_size);

// What a run reads from its data directory, as "name=value" lines for check_ranks_agree: one per shard of
// <dir> (train and val), "--data train_000001.bin=1000000 tokens, vocab 256, checksum 0x..." from the shard's
// 64-byte header, never a pass over its tokens. A directory whose shards cannot be listed or read gives one
// line that says so, the same on every rank (the cause follows when the run opens the data).
std::vector<std::string> data_agreement_lines(const std::string& option, const std::string& dir);

// Collective: each rank's digest of agreed_options(app, comm.size()) and of `inputs` (lines such as
// data_agreement_lines', or the checkpoint a rank would resume) is all-gathered (8 bytes a rank); when
// they differ, the lines too, and every rank throws scalelab::Error naming each differing option or input
// with every rank's value (ranks of equal value together). Call it first thing on every rank
// (run_on_all_ranks does), before any collective whose size depends on an option or an input.
void check_ranks_agree(Communicator& comm, const CLI::App& app, const std::vector<std::string>& inputs = {});

}  // namespace scalelab::driver
