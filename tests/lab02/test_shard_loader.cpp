// test_shard_loader.cpp — lab 02's reference data pipeline: shard files, byte tokenizer, ShardLoader.
// Code under test: solutions/02_data_pipeline/shard_loader.cpp (declared in labs/02_data_pipeline/shard_loader.h).
// Rules checked here are written down in docs/formats.md ("Token shards", "Loader order").
#include <gtest/gtest.h>  // defines: TEST, EXPECT_*

#include <unistd.h>    // defines: getpid (a scratch directory name per process)

#include <algorithm>   // defines: std::sort
#include <cstdio>      // defines: std::FILE, std::fopen
#include <filesystem>  // defines: std::filesystem (a scratch directory per test)
#include <fstream>     // defines: std::ofstream
#include <memory>      // defines: std::unique_ptr (one loader per rank)
#include <set>         // defines: std::set (disjointness checks)
#include <string>
#include <vector>

#include "scalelab/core/error.h"  // defines: scalelab::Error
#include "shard_loader.h"    // defines: scalelab::lab02::* (reference track)

namespace fs = std::filesystem;
namespace lab02 = scalelab::lab02;

namespace {

// A fresh directory per test, removed afterwards.
class ShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("sl_test_shards_" + std::string(info->name()) + "_" +
                                        std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A stream whose token at position i is i (vocab large enough: 4-byte tokens), cut into shards of
  // the given sizes. A window's tokens then say where they came from.
  std::vector<std::string> write_counting_stream(const std::vector<int>& shard_sizes) {
    std::vector<std::string> files;
    int32_t next = 0;
    for (size_t s = 0; s < shard_sizes.size(); ++s) {
      std::vector<int32_t> tokens(shard_sizes[s]);
      for (int32_t& t : tokens) t = next++;
      char name[32];
      std::snprintf(name, sizeof(name), "train_%06zu.bin", s);
      lab02::write_shard(path(name), tokens, kCountingVocab);
      files.push_back(path(name));
    }
    return files;
  }
  static constexpr int kCountingVocab = 1 << 20;  // > 65536, so 4-byte tokens

  fs::path dir_;
};

// EXPECT that calling f throws scalelab::Error whose message contains every one of `parts`.
template <typename F>
void expect_error_containing(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected scalelab::Error containing '" << parts.front() << "', nothing was thrown";
  } catch (const scalelab::Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in:\n" << msg;
  }
}

void overwrite_bytes(const std::string& file, long offset, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(file.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, offset, SEEK_SET);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

void expect_same_batch(const lab02::Batch& a, const lab02::Batch& b, const std::string& what) {
  EXPECT_EQ(a.epoch, b.epoch) << what;
  EXPECT_EQ(a.batch_in_epoch, b.batch_in_epoch) << what;
  EXPECT_EQ(a.window_ids, b.window_ids) << what;
  EXPECT_EQ(a.inputs, b.inputs) << what;
  EXPECT_EQ(a.targets, b.targets) << what;
}

lab02::LoaderConfig small_config(int B, int T, bool prefetch = true) {
  lab02::LoaderConfig c;
  c.B = B;
  c.T = T;
  c.seed = 42;
  c.prefetch = prefetch;
  return c;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Shard files
// ---------------------------------------------------------------------------------------------
TEST_F(ShardTest, WriteThenReadRoundTrips) {
  const std::vector<int32_t> tokens = {0, 1, 255, 7, 128, 42};
  lab02::write_shard(path("a.bin"), tokens, 256);
  const lab02::ShardHeader h = lab02::read_shard_header(path("a.bin"));
  EXPECT_EQ(h.version, 1u);
  EXPECT_EQ(h.bytes_per_token, 2u);
  EXPECT_EQ(h.vocab_size, 256u);
  EXPECT_EQ(h.token_count, tokens.size());
  EXPECT_EQ(lab02::read_shard(path("a.bin")), tokens);
  EXPECT_FALSE(fs::exists(path("a.bin.tmp"))) << "the temporary file must be renamed away";
}

TEST_F(ShardTest, TwoByteTokensUpToVocab65536FourBytesAbove) {
  const std::vector<int32_t> small = {0, 65535, 12345};  // fits 2 bytes
  lab02::write_shard(path("two.bin"), small, 65536);
  EXPECT_EQ(lab02::read_shard_header(path("two.bin")).bytes_per_token, 2u);
  EXPECT_EQ(fs::file_size(path("two.bin")), lab02::kShardHeaderBytes + 2 * small.size());
  EXPECT_EQ(lab02::read_shard(path("two.bin")), small);

  const std::vector<int32_t> big = {0, 65536, 69999, 3};  // vocab 70000 needs 4 bytes
  lab02::write_shard(path("four.bin"), big, 70000);
  EXPECT_EQ(lab02::read_shard_header(path("four.bin")).bytes_per_token, 4u);
  EXPECT_EQ(fs::file_size(path("four.bin")), lab02::kShardHeaderBytes + 4 * big.size());
  EXPECT_EQ(lab02::read_shard(path("four.bin")), big);
}

TEST_F(ShardTest, HeaderIsLittleEndianAsDocumented) {
  lab02::write_shard(path("h.bin"), {1, 2, 3}, 256);
  std::ifstream in(path("h.bin"), std::ios::binary);
  std::vector<uint8_t> b(64 + 6);
  in.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(b.size()));
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "SLSHARD1");
  EXPECT_EQ(b[8], 1);    // version
  EXPECT_EQ(b[12], 2);   // bytes_per_token
  EXPECT_EQ(b[16], 0);   // vocab_size 256 = 0x100, little-endian
  EXPECT_EQ(b[17], 1);
  EXPECT_EQ(b[24], 3);   // token_count
  for (int i = 40; i < 64; ++i) EXPECT_EQ(b[i], 0) << "padding byte " << i;
  EXPECT_EQ(b[64], 1);   // first token, low byte first
  EXPECT_EQ(b[65], 0);
  const uint8_t body[6] = {1, 0, 2, 0, 3, 0};
  EXPECT_EQ(lab02::read_shard_header(path("h.bin")).checksum, lab02::fnv1a64(body, 6));
}

TEST(ShardFormat, Fnv1aMatchesPublishedTestVectors) {
  // http://www.isthe.com/chongo/src/fnv/test_fnv.c: "" and "a" under FNV-1a 64.
  EXPECT_EQ(lab02::fnv1a64(nullptr, 0), 0xcbf29ce484222325ull);
  const uint8_t a = 'a';
  EXPECT_EQ(lab02::fnv1a64(&a, 1), 0xaf63dc4c8601ec8cull);
}

TEST_F(ShardTest, WriteRejectsTokenOutsideVocabAndLeavesNoFile) {
  expect_error_containing([&] { lab02::write_shard(path("bad.bin"), {1, 256}, 256); },
                          {"token 256 at index 1", "vocab_size=256"});
  EXPECT_FALSE(fs::exists(path("bad.bin")));
  EXPECT_FALSE(fs::exists(path("bad.bin.tmp")));
}

TEST_F(ShardTest, BadMagicSaysNotAShard) {
  std::ofstream(path("notes.bin")) << "hello, this is a text file and certainly not a shard of tokens\n";
  expect_error_containing([&] { lab02::read_shard_header(path("notes.bin")); },
                          {"not a scalelab shard", "sl_make_shards"});
  std::ofstream(path("tiny.bin")) << "hi";
  expect_error_containing([&] { lab02::read_shard_header(path("tiny.bin")); }, {"not a scalelab shard"});
}

TEST_F(ShardTest, MissingFileSaysSo) {
  expect_error_containing([&] { lab02::read_shard_header(path("nope.bin")); }, {"does not exist", "prepare_corpus"});
}

TEST_F(ShardTest, TruncatedBodySaysExpectedAndFound) {
  std::vector<int32_t> tokens(100, 7);
  lab02::write_shard(path("t.bin"), tokens, 256);
  fs::resize_file(path("t.bin"), 64 + 150);  // 75 of 100 tokens
  expect_error_containing([&] { lab02::read_shard_header(path("t.bin")); },
                          {"truncated", "expected 264 bytes", "found 214"});
}

TEST_F(ShardTest, ChecksumMismatchIsReported) {
  lab02::write_shard(path("c.bin"), std::vector<int32_t>(50, 9), 256);
  overwrite_bytes(path("c.bin"), 64 + 10, {8});  // one token's low byte: 9 -> 8
  expect_error_containing([&] { lab02::read_shard_header(path("c.bin")); }, {"checksum mismatch", "FNV-1a"});
  EXPECT_NO_THROW(lab02::read_shard_header(path("c.bin"), /*verify_checksum=*/false));
}

TEST_F(ShardTest, UnsupportedVersionIsReported) {
  lab02::write_shard(path("v.bin"), {1, 2}, 256);
  overwrite_bytes(path("v.bin"), 8, {2});
  expect_error_containing([&] { lab02::read_shard_header(path("v.bin")); }, {"unsupported shard version 2"});
}

TEST_F(ShardTest, ListShardsSortsAndIgnoresOtherFiles) {
  for (const char* name : {"train_000002.bin", "train_000000.bin", "train_000001.bin", "val_000000.bin"})
    lab02::write_shard(path(name), {1, 2, 3}, 256);
  std::ofstream(path("train_000003.bin.tmp")) << "partial";
  std::ofstream(path("train_notes.bin")) << "x";
  const std::vector<std::string> train = lab02::list_shards(dir_.string(), "train");
  ASSERT_EQ(train.size(), 3u);
  EXPECT_EQ(fs::path(train[0]).filename(), "train_000000.bin");
  EXPECT_EQ(fs::path(train[2]).filename(), "train_000002.bin");
  EXPECT_EQ(lab02::list_shards(dir_.string(), "val").size(), 1u);
  expect_error_containing([&] { lab02::list_shards(dir_.string(), "test"); }, {"no 'test_*.bin' shards"});
  expect_error_containing([&] { lab02::list_shards(path("missing"), "train"); }, {"does not exist"});
}

// ---------------------------------------------------------------------------------------------
// Byte-level tokenizer
// ---------------------------------------------------------------------------------------------
TEST(ByteTokenizer, EveryByteRoundTrips) {
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  const std::vector<int32_t> tokens = lab02::encode_bytes(all);
  ASSERT_EQ(tokens.size(), 256u);
  for (int c = 0; c < 256; ++c) EXPECT_EQ(tokens[c], c);
  EXPECT_EQ(lab02::decode_bytes(tokens), all);
  EXPECT_EQ(lab02::encode_bytes("In the beginning")[0], 'I');
  EXPECT_THROW(lab02::decode_bytes({65, 256}), scalelab::Error);
}

// ---------------------------------------------------------------------------------------------
// Loader: windows, order, ranks
// ---------------------------------------------------------------------------------------------
TEST_F(ShardTest, WindowsStartEveryTTokensAndCrossShards) {
  const int T = 8, B = 2;
  const auto files = write_counting_stream({37, 5, 60});  // N = 102, uneven shards
  lab02::ShardLoader loader(files, small_config(B, T));
  EXPECT_EQ(loader.tokens_total(), 102);
  EXPECT_EQ(loader.windows_per_epoch(), (102 - 1) / T);  // 12
  EXPECT_EQ(loader.batches_per_epoch(), 12 / B);
  EXPECT_EQ(loader.vocab_size(), kCountingVocab);
  std::set<int64_t> seen;
  for (int64_t k = 0; k < loader.batches_per_epoch(); ++k) {
    const lab02::Batch batch = loader.next();
    ASSERT_EQ(batch.inputs.size(), static_cast<size_t>(B * T));
    ASSERT_EQ(batch.targets.size(), static_cast<size_t>(B * T));
    for (int b = 0; b < B; ++b) {
      const int64_t w = batch.window_ids[b];
      seen.insert(w);
      for (int t = 0; t < T; ++t) {  // token value == stream position (write_counting_stream)
        EXPECT_EQ(batch.inputs[b * T + t], w * T + t) << "window " << w << " t " << t;
        EXPECT_EQ(batch.targets[b * T + t], w * T + t + 1) << "window " << w << " t " << t;
      }
    }
  }
  EXPECT_EQ(seen.size(), 12u) << "one epoch visits every window once";
}

TEST(LoaderOrder, NoShuffleIsStreamOrderAndShuffleIsAPermutation) {
  const std::vector<int64_t> plain = lab02::epoch_window_order(10, 1, 3, /*shuffle=*/false);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(plain[i], i);
  std::vector<int64_t> shuffled = lab02::epoch_window_order(1000, 1, 0, /*shuffle=*/true);
  EXPECT_NE(shuffled, lab02::epoch_window_order(1000, 1, 0, false));
  EXPECT_EQ(shuffled, lab02::epoch_window_order(1000, 1, 0, true)) << "a pure function of (seed, epoch)";
  EXPECT_NE(shuffled, lab02::epoch_window_order(1000, 1, 1, true)) << "each epoch has its own order";
  EXPECT_NE(shuffled, lab02::epoch_window_order(1000, 2, 0, true)) << "each seed has its own order";
  std::sort(shuffled.begin(), shuffled.end());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(shuffled[i], i);
}

TEST_F(ShardTest, SameSeedSameBatchesOtherSeedOtherBatches) {
  const auto files = write_counting_stream({4000});
  lab02::LoaderConfig cfg = small_config(4, 16);
  lab02::ShardLoader a(files, cfg), b(files, cfg);
  cfg.seed = 43;
  lab02::ShardLoader c(files, cfg);
  const int64_t n = 2 * a.batches_per_epoch() + 3;  // into the third epoch
  bool any_differs = false;
  for (int64_t k = 0; k < n; ++k) {
    const lab02::Batch ba = a.next(), bb = b.next(), bc = c.next();
    expect_same_batch(ba, bb, "batch " + std::to_string(k));
    any_differs = any_differs || ba.window_ids != bc.window_ids;
  }
  EXPECT_TRUE(any_differs) << "seed 42 and 43 gave the same batches";
}

TEST_F(ShardTest, RanksAreDisjointAndCoverTheGlobalBatches) {
  const int B = 3, T = 10, dp_size = 4;
  const auto files = write_counting_stream({700, 555});  // N = 1255 -> W = 125 windows
  std::vector<std::unique_ptr<lab02::ShardLoader>> ranks;
  for (int r = 0; r < dp_size; ++r) {
    lab02::LoaderConfig cfg = small_config(B, T);
    cfg.dp_rank = r;
    cfg.dp_size = dp_size;
    ranks.push_back(std::make_unique<lab02::ShardLoader>(files, cfg));
  }
  // The same data on one rank with B*dp_size windows per batch: the global batches.
  lab02::ShardLoader single(files, small_config(B * dp_size, T));
  const int64_t W = single.windows_per_epoch();
  ASSERT_EQ(W, 125);
  const int64_t bpe = W / (B * dp_size);  // 10 global batches; 5 windows skipped each epoch
  for (auto& r : ranks) ASSERT_EQ(r->batches_per_epoch(), bpe) << "every rank steps the same number of times";
  ASSERT_EQ(single.batches_per_epoch(), bpe);

  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> epoch_windows;
    for (int64_t k = 0; k < bpe; ++k) {
      std::set<int64_t> global;
      for (auto& r : ranks) {
        const lab02::Batch batch = r->next();
        for (int64_t w : batch.window_ids) {
          EXPECT_TRUE(global.insert(w).second) << "window " << w << " given to two ranks (batch " << k << ")";
          EXPECT_TRUE(epoch_windows.insert(w).second) << "window " << w << " twice in epoch " << epoch;
        }
      }
      const lab02::Batch g = single.next();
      EXPECT_EQ(global, std::set<int64_t>(g.window_ids.begin(), g.window_ids.end()))
          << "dp_size ranks of B windows see the global batch of one rank with B*dp_size";
    }
    EXPECT_EQ(static_cast<int64_t>(epoch_windows.size()), bpe * B * dp_size);
    EXPECT_EQ(static_cast<int64_t>(epoch_windows.size()), W - W % (B * dp_size)) << "covering, minus the tail";
  }
}

TEST(LoaderOrder, RankBatchWindowsTakesEveryDpSizeThEntry) {
  std::vector<int64_t> order(24);
  for (int i = 0; i < 24; ++i) order[i] = 100 + i;
  // B=2, dp_size=3: global batch 1 is entries 6..11; rank 1 takes 7 and 10.
  EXPECT_EQ(lab02::rank_batch_windows(order, 1, 2, 1, 3), (std::vector<int64_t>{107, 110}));
  EXPECT_THROW(lab02::rank_batch_windows(order, 4, 2, 0, 3), scalelab::Error);  // beyond the epoch
  EXPECT_THROW(lab02::rank_batch_windows(order, 0, 2, 3, 3), scalelab::Error);  // rank out of range
}

// ---------------------------------------------------------------------------------------------
// Loader: resume, prefetch, wait time
// ---------------------------------------------------------------------------------------------
TEST_F(ShardTest, ResumeGivesIdenticalBatchesAcrossEpochBoundary) {
  const auto files = write_counting_stream({300, 211});
  const lab02::LoaderConfig cfg = small_config(2, 12);
  lab02::ShardLoader a(files, cfg);
  const int64_t bpe = a.batches_per_epoch();  // (510/12 = 42 windows) / 2 = 21
  ASSERT_GE(bpe, 4);
  for (int64_t k : {int64_t{3}, bpe - 2, bpe}) {  // mid-epoch, just before and exactly at the boundary
    lab02::ShardLoader run(files, cfg);
    for (int64_t i = 0; i < k; ++i) run.next();
    const std::vector<uint8_t> saved = run.state().to_bytes();  // as a checkpoint would store it
    ASSERT_EQ(saved.size(), lab02::LoaderState::kBytes);

    for (bool prefetch : {true, false}) {
      lab02::ShardLoader resumed(files, small_config(2, 12, prefetch));
      resumed.next();  // consume something first: restore must discard it (and the prefetched queue)
      resumed.restore(lab02::LoaderState::from_bytes(saved));
      lab02::ShardLoader reference(files, cfg);  // the uninterrupted run
      for (int64_t i = 0; i < k; ++i) reference.next();
      for (int i = 0; i < 5; ++i)
        expect_same_batch(reference.next(), resumed.next(),
                          "k=" + std::to_string(k) + " prefetch=" + std::to_string(prefetch) + " i=" +
                              std::to_string(i));
    }
  }
}

TEST_F(ShardTest, RestoreAdoptsTheSavedSeed) {
  const auto files = write_counting_stream({900});
  lab02::ShardLoader a(files, small_config(2, 8));
  a.next();
  lab02::LoaderConfig other = small_config(2, 8);
  other.seed = 7;
  lab02::ShardLoader b(files, other);
  b.restore(a.state());
  expect_same_batch(a.next(), b.next(), "after restore");
}

TEST_F(ShardTest, RestoreRejectsAStateOfAnotherLoader) {
  const auto files = write_counting_stream({900});
  lab02::ShardLoader a(files, small_config(2, 8));
  lab02::ShardLoader b(files, small_config(4, 8));
  expect_error_containing([&] { b.restore(a.state()); }, {"B=2 T=8", "B=4 T=8"});
  std::vector<uint8_t> bytes = a.state().to_bytes();
  bytes[0] = 'X';
  expect_error_containing([&] { lab02::LoaderState::from_bytes(bytes); }, {"not a loader state"});
  expect_error_containing([&] { lab02::LoaderState::from_bytes({1, 2, 3}); }, {"3 bytes, expected 64"});
}

TEST_F(ShardTest, StateBytesRoundTrip) {
  lab02::LoaderState s;
  s.seed = 0x0123456789abcdefull;
  s.epoch = 5;
  s.batch_in_epoch = 17;
  s.B = 8;
  s.T = 256;
  s.dp_size = 4;
  s.dp_rank = 3;
  s.shuffle = false;
  s.tokens_total = 4404412;
  const lab02::LoaderState r = lab02::LoaderState::from_bytes(s.to_bytes());
  EXPECT_EQ(r.seed, s.seed);
  EXPECT_EQ(r.epoch, s.epoch);
  EXPECT_EQ(r.batch_in_epoch, s.batch_in_epoch);
  EXPECT_EQ(r.B, s.B);
  EXPECT_EQ(r.T, s.T);
  EXPECT_EQ(r.dp_size, s.dp_size);
  EXPECT_EQ(r.dp_rank, s.dp_rank);
  EXPECT_EQ(r.shuffle, s.shuffle);
  EXPECT_EQ(r.tokens_total, s.tokens_total);
}

TEST_F(ShardTest, SkipBatchesEqualsReadingThem) {
  const auto files = write_counting_stream({500});
  lab02::ShardLoader read(files, small_config(3, 9)), skipped(files, small_config(3, 9));
  const int64_t n = read.batches_per_epoch() + 2;  // into the next epoch
  for (int64_t i = 0; i < n; ++i) read.next();
  skipped.skip_batches(n);
  EXPECT_EQ(skipped.state().epoch, 1);
  expect_same_batch(read.next(), skipped.next(), "after skip");
}

TEST_F(ShardTest, PrefetchOnAndOffGiveIdenticalBatches) {
  const auto files = write_counting_stream({1000, 1000, 17});
  lab02::ShardLoader on(files, small_config(4, 32, /*prefetch=*/true));
  lab02::ShardLoader off(files, small_config(4, 32, /*prefetch=*/false));
  for (int64_t k = 0; k < 3 * on.batches_per_epoch(); ++k)
    expect_same_batch(on.next(), off.next(), "batch " + std::to_string(k));
}

TEST_F(ShardTest, WaitTimeIsReportedAndNonNegative) {
  const auto files = write_counting_stream({1000});
  for (bool prefetch : {true, false}) {
    lab02::ShardLoader loader(files, small_config(2, 16, prefetch));
    for (int k = 0; k < 10; ++k) {
      const double ms = loader.next().wait_ms;
      EXPECT_GE(ms, 0.0);
      EXPECT_LT(ms, 10000.0) << "a batch of 32 tokens took more than 10 s";
    }
  }
}

TEST_F(ShardTest, LoaderErrorsAreClear) {
  const auto files = write_counting_stream({50});
  expect_error_containing([&] { lab02::ShardLoader(files, small_config(8, 16)); },
                          {"50 tokens make 3 windows", "smaller B or T"});
  lab02::write_shard(path("bytes.bin"), {1, 2, 3}, 256);
  expect_error_containing([&] { lab02::ShardLoader({files[0], path("bytes.bin")}, small_config(1, 2)); },
                          {"vocab_size 256"});
  expect_error_containing([&] { lab02::ShardLoader(dir_.string(), "val", small_config(1, 2)); },
                          {"no 'val_*.bin' shards"});
  lab02::LoaderConfig bad_rank = small_config(1, 2);
  bad_rank.dp_rank = 2;
  bad_rank.dp_size = 2;
  expect_error_containing([&] { lab02::ShardLoader(files, bad_rank); }, {"dp_rank=2 dp_size=2"});
}

TEST_F(ShardTest, LoaderFromDirectoryAndSplit) {
  write_counting_stream({100, 100});
  lab02::ShardLoader loader(dir_.string(), "train", small_config(2, 10));
  EXPECT_EQ(loader.tokens_total(), 200);
}
