// test_shards.cpp — common's data layer: shard files (format, writer, readers, the list of a split, the
// errors a damaged file gets), the byte tokenizer, the loader state's 64-byte record and load_batch.
// Code under test: common/src/data/*.cpp (scalelab/data/). Rules checked here are written down in
// docs/formats.md ("Token shards"). The loader that serves windows from shards is lab 02's (tests/lab02).
#include <gtest/gtest.h>  // defines: TEST, EXPECT_*

#include <unistd.h>  // defines: getpid (a scratch directory name per process)

#include <cstdio>      // defines: std::FILE, std::fopen
#include <filesystem>  // defines: std::filesystem::exists, file_size, resize_file
#include <fstream>     // defines: std::ofstream, std::ifstream
#include <string>
#include <vector>

#include "expect_error.h"          // defines: test::expect_error_containing
#include "scalelab/core/error.h"   // defines: scalelab::Error
#include "scalelab/core/tensor.h"  // defines: Tensor (load_batch)
#include "scalelab/data/batch.h"   // defines: data::Batch, LoaderState, load_batch
#include "scalelab/data/shard.h"  // defines: data::write_shard, read_shard_header, read_shard, list_shards, MappedShard
#include "scalelab/data/tokenizer.h"  // defines: data::encode_bytes, decode_bytes

namespace fs = std::filesystem;
namespace data = scalelab::data;
using scalelab::Tensor;
using scalelab::test::expect_error_containing;

namespace {

// A fresh directory per test, removed afterwards.
class ShardFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("sl_data_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

void overwrite_bytes(const std::string& file, long offset, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(file.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, offset, SEEK_SET);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Shard files
// ---------------------------------------------------------------------------------------------
TEST_F(ShardFileTest, WriteThenReadRoundTrips) {
  const std::vector<int32_t> tokens = {0, 1, 255, 7, 128, 42};
  data::write_shard(path("a.bin"), tokens, 256);
  const data::ShardHeader h = data::read_shard_header(path("a.bin"));
  EXPECT_EQ(h.version, 1u);
  EXPECT_EQ(h.bytes_per_token, 2u);
  EXPECT_EQ(h.vocab_size, 256u);
  EXPECT_EQ(h.token_count, tokens.size());
  EXPECT_EQ(data::read_shard(path("a.bin")), tokens);
  EXPECT_FALSE(fs::exists(path("a.bin.tmp"))) << "the temporary file must be renamed away";
}

TEST_F(ShardFileTest, TwoByteTokensUpToVocab65536FourBytesAbove) {
  const std::vector<int32_t> small = {0, 65535, 12345};  // fits 2 bytes
  data::write_shard(path("two.bin"), small, 65536);
  EXPECT_EQ(data::read_shard_header(path("two.bin")).bytes_per_token, 2u);
  EXPECT_EQ(fs::file_size(path("two.bin")), data::kShardHeaderBytes + 2 * small.size());
  EXPECT_EQ(data::read_shard(path("two.bin")), small);

  const std::vector<int32_t> big = {0, 65536, 69999, 3};  // vocab 70000 needs 4 bytes
  data::write_shard(path("four.bin"), big, 70000);
  EXPECT_EQ(data::read_shard_header(path("four.bin")).bytes_per_token, 4u);
  EXPECT_EQ(fs::file_size(path("four.bin")), data::kShardHeaderBytes + 4 * big.size());
  EXPECT_EQ(data::read_shard(path("four.bin")), big);
}

TEST_F(ShardFileTest, HeaderIsLittleEndianAsDocumented) {
  data::write_shard(path("h.bin"), {1, 2, 3}, 256);
  std::ifstream in(path("h.bin"), std::ios::binary);
  std::vector<uint8_t> b(64 + 6);
  in.read(reinterpret_cast<char*>(b.data()), static_cast<std::streamsize>(b.size()));
  EXPECT_EQ(std::string(b.begin(), b.begin() + 8), "SLSHARD1");
  EXPECT_EQ(b[8], 1);   // version
  EXPECT_EQ(b[12], 2);  // bytes_per_token
  EXPECT_EQ(b[16], 0);  // vocab_size 256 = 0x100, little-endian
  EXPECT_EQ(b[17], 1);
  EXPECT_EQ(b[24], 3);  // token_count
  for (int i = 40; i < 64; ++i) EXPECT_EQ(b[i], 0) << "padding byte " << i;
  EXPECT_EQ(b[64], 1);  // first token, low byte first
  EXPECT_EQ(b[65], 0);
  const uint8_t body[6] = {1, 0, 2, 0, 3, 0};
  EXPECT_EQ(data::read_shard_header(path("h.bin")).checksum, data::fnv1a64(body, 6));
}

TEST(ShardFormat, Fnv1aMatchesPublishedTestVectors) {
  // http://www.isthe.com/chongo/src/fnv/test_fnv.c: "" and "a" under FNV-1a 64.
  EXPECT_EQ(data::fnv1a64(nullptr, 0), 0xcbf29ce484222325ull);
  const uint8_t a = 'a';
  EXPECT_EQ(data::fnv1a64(&a, 1), 0xaf63dc4c8601ec8cull);
}

TEST_F(ShardFileTest, WriteRejectsTokenOutsideVocabAndLeavesNoFile) {
  expect_error_containing(
      [&] {
        data::write_shard(path("bad.bin"), {1, 256}, 256);
      },
      {"token 256 at index 1", "vocab_size=256"});
  EXPECT_FALSE(fs::exists(path("bad.bin")));
  EXPECT_FALSE(fs::exists(path("bad.bin.tmp")));
}

TEST_F(ShardFileTest, BadMagicSaysNotAShard) {
  std::ofstream(path("notes.bin")) << "hello, this is a text file and certainly not a shard of tokens\n";
  expect_error_containing([&] { data::read_shard_header(path("notes.bin")); },
                          {"not a scalelab shard", "sl_make_shards"});
  std::ofstream(path("tiny.bin")) << "hi";
  expect_error_containing([&] { data::read_shard_header(path("tiny.bin")); }, {"not a scalelab shard"});
}

TEST_F(ShardFileTest, MissingFileSaysSo) {
  expect_error_containing([&] { data::read_shard_header(path("nope.bin")); }, {"does not exist", "prepare_corpus"});
}

TEST_F(ShardFileTest, TruncatedBodySaysExpectedAndFound) {
  std::vector<int32_t> tokens(100, 7);
  data::write_shard(path("t.bin"), tokens, 256);
  fs::resize_file(path("t.bin"), 64 + 150);  // 75 of 100 tokens
  expect_error_containing([&] { data::read_shard_header(path("t.bin")); },
                          {"truncated", "expected 264 bytes", "found 214"});
}

// Found by tests/fuzz/fuzz_shard (its corpus keeps the input): a header whose token count times the token's
// bytes wraps around 2^64 to the file's real size passed the size check; without the checksum, copy_tokens
// then read far past the mapping. 2^63 + 11 tokens of 2 bytes: 64 + 2 * (2^63 + 11) = 86 mod 2^64.
TEST_F(ShardFileTest, TokenCountWhoseSizeWrapsAroundIsRefused) {
  data::write_shard(path("w.bin"), std::vector<int32_t>(11, 5), 256);  // 2-byte tokens: 64 + 22 = 86 bytes
  overwrite_bytes(path("w.bin"), 24, {11, 0, 0, 0, 0, 0, 0, 0x80});    // token_count = 2^63 + 11
  for (bool verify : {false, true}) {
    expect_error_containing([&] { data::MappedShard(path("w.bin"), verify); },
                            {"damaged shard", "9223372036854775819 tokens of 2 bytes"});
  }
}

TEST_F(ShardFileTest, ChecksumMismatchIsReported) {
  data::write_shard(path("c.bin"), std::vector<int32_t>(50, 9), 256);
  overwrite_bytes(path("c.bin"), 64 + 10, {8});  // one token's low byte: 9 -> 8
  expect_error_containing([&] { data::read_shard_header(path("c.bin")); }, {"checksum mismatch", "FNV-1a"});
  EXPECT_NO_THROW(data::read_shard_header(path("c.bin"), /*verify_checksum=*/false));
}

TEST_F(ShardFileTest, UnsupportedVersionIsReported) {
  data::write_shard(path("v.bin"), {1, 2}, 256);
  overwrite_bytes(path("v.bin"), 8, {2});
  expect_error_containing([&] { data::read_shard_header(path("v.bin")); }, {"unsupported shard version 2"});
}

TEST_F(ShardFileTest, ListShardsSortsAndIgnoresOtherFiles) {
  for (const char* name : {"train_000002.bin", "train_000000.bin", "train_000001.bin", "val_000000.bin"})
    data::write_shard(path(name), {1, 2, 3}, 256);
  std::ofstream(path("train_000003.bin.tmp")) << "partial";
  std::ofstream(path("train_notes.bin")) << "x";
  const std::vector<std::string> train = data::list_shards(dir_.string(), "train");
  ASSERT_EQ(train.size(), 3u);
  EXPECT_EQ(fs::path(train[0]).filename(), "train_000000.bin");
  EXPECT_EQ(fs::path(train[2]).filename(), "train_000002.bin");
  EXPECT_EQ(data::list_shards(dir_.string(), "val").size(), 1u);
  expect_error_containing([&] { data::list_shards(dir_.string(), "test"); }, {"no 'test_*.bin' shards"});
  expect_error_containing([&] { data::list_shards(path("missing"), "train"); }, {"does not exist"});
}

// ---------------------------------------------------------------------------------------------
// Byte-level tokenizer
// ---------------------------------------------------------------------------------------------
TEST(ByteTokenizer, EveryByteRoundTrips) {
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  const std::vector<int32_t> tokens = data::encode_bytes(all);
  ASSERT_EQ(tokens.size(), 256u);
  for (int c = 0; c < 256; ++c) EXPECT_EQ(tokens[c], c);
  EXPECT_EQ(data::decode_bytes(tokens), all);
  EXPECT_EQ(data::encode_bytes("In the beginning")[0], 'I');
  EXPECT_THROW(data::decode_bytes({65, 256}), scalelab::Error);
}

// ---------------------------------------------------------------------------------------------
// The loader state record and load_batch
// ---------------------------------------------------------------------------------------------
TEST(LoaderStateRecord, BytesRoundTrip) {
  data::LoaderState s;
  s.seed = 0x0123456789abcdefull;
  s.epoch = 5;
  s.batch_in_epoch = 17;
  s.B = 8;
  s.T = 256;
  s.dp_size = 4;
  s.dp_rank = 3;
  s.shuffle = false;
  s.tokens_total = 4404412;
  const data::LoaderState r = data::LoaderState::from_bytes(s.to_bytes());
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

TEST_F(ShardFileTest, MappedShardCopiesAnyRangeOfTokens) {
  std::vector<int32_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(1000 * i);  // 4-byte tokens
  data::write_shard(path("m.bin"), tokens, 1 << 20);
  data::MappedShard shard(path("m.bin"), /*verify_checksum=*/true);
  EXPECT_EQ(shard.token_count(), 300);
  EXPECT_EQ(shard.header().bytes_per_token, 4u);
  std::vector<int32_t> out(7);
  shard.copy_tokens(290, 7, out.data());
  EXPECT_EQ(out, std::vector<int32_t>(tokens.begin() + 290, tokens.begin() + 297));
  data::MappedShard moved = std::move(shard);  // the mapping moves with it; the emptied one unmaps nothing
  moved.copy_tokens(0, 1, out.data());
  EXPECT_EQ(out[0], 0);
  expect_error_containing([&] { moved.copy_tokens(295, 6, out.data()); }, {"[295, 301) outside shard"});
}

TEST(LoaderStateRecord, BadRecordsAreRefused) {
  std::vector<uint8_t> bytes = data::LoaderState{}.to_bytes();
  bytes[0] = 'X';
  expect_error_containing([&] { data::LoaderState::from_bytes(bytes); }, {"not a loader state"});
  expect_error_containing([&] { data::LoaderState::from_bytes({1, 2, 3}); }, {"3 bytes, expected 64"});
}

TEST(LoadBatch, CopiesInputsAndTargetsAndRefusesOtherShapes) {
  data::Batch b;
  b.B = 2;
  b.T = 3;
  b.inputs = {1, 2, 3, 4, 5, 6};
  b.targets = {2, 3, 4, 5, 6, 7};
  Tensor x = Tensor::empty({2, 3}, scalelab::DType::I32), y = Tensor::empty({2, 3}, scalelab::DType::I32);
  data::load_batch(b, x, y);
  EXPECT_EQ(std::vector<int32_t>(x.data<int32_t>(), x.data<int32_t>() + 6), b.inputs);
  EXPECT_EQ(std::vector<int32_t>(y.data<int32_t>(), y.data<int32_t>() + 6), b.targets);
  Tensor wrong = Tensor::empty({3, 2}, scalelab::DType::I32);
  expect_error_containing([&] { data::load_batch(b, wrong, y); }, {"batch is (2, 3) i32"});
}
