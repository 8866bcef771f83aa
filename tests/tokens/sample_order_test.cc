// The loader's sample order: every epoch a permutation of the samples, a new one each epoch,
// the same numbers everywhere (golden values); each global batch split between data-parallel
// replicas so that their union in replica order does not depend on the degree; positions that
// survive a JSON round trip and resume exactly, with the same or another degree.
#include "data/sample_order.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "data/sample_windows.h"
#include "data/token_dataset.h"
#include "gtest/gtest.h"
#include "tests/tokens/token_files.h"

namespace tandem::data {
namespace {

SampleOrder MakeOrder(uint64_t seed, int64_t samples, int64_t global_batch, int degree = 1,
                      int replica = 0) {
  SampleOrderOptions options;
  options.seed = seed;
  options.samples_per_epoch = samples;
  options.global_batch_size = global_batch;
  options.data_parallel_degree = degree;
  options.replica_index = replica;
  auto order = SampleOrder::Create(options);
  EXPECT_TRUE(order.ok()) << order.status();
  return *order;
}

std::vector<int64_t> EpochOrder(const SampleOrder& order, int64_t epoch) {
  std::vector<int64_t> samples;
  for (int64_t i = 0; i < order.options().samples_per_epoch; ++i) {
    samples.push_back(order.SampleAt(epoch, i));
  }
  return samples;
}

bool IsPermutation(std::vector<int64_t> samples) {
  std::sort(samples.begin(), samples.end());
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

TEST(SampleOrderTest, EveryEpochReadsEachSampleOnceInANewOrder) {
  for (int64_t samples : {1, 2, 3, 17, 1000, 4097, 65536}) {
    SCOPED_TRACE(samples);
    const SampleOrder order = MakeOrder(/*seed=*/42, samples, /*global_batch=*/1);
    const std::vector<int64_t> first = EpochOrder(order, 0);
    const std::vector<int64_t> second = EpochOrder(order, 1);
    EXPECT_TRUE(IsPermutation(first));
    EXPECT_TRUE(IsPermutation(second));
    if (samples >= 17) {
      EXPECT_NE(first, second);
      // Shuffled, not merely rotated: few samples keep their place.
      int64_t fixed = 0;
      for (int64_t i = 0; i < samples; ++i) fixed += first[i] == i;
      EXPECT_LT(fixed, std::max<int64_t>(4, samples / 20));
    }
  }
  EXPECT_NE(EpochOrder(MakeOrder(1, 1000, 1), 0), EpochOrder(MakeOrder(2, 1000, 1), 0));
}

TEST(SampleOrderTest, StepsOfOneEpochReadDistinctSamplesAndDropTheRemainder) {
  const SampleOrder order = MakeOrder(7, /*samples=*/1000, /*global_batch=*/64);
  EXPECT_EQ(order.steps_per_epoch(), 15);  // 960 samples; 40 of each epoch's order unread
  LoaderPosition position = order.Start();
  std::set<int64_t> seen;
  for (int step = 0; step < 15; ++step) {
    EXPECT_EQ(position.epoch, 0);
    for (int64_t sample : order.GlobalBatch(position)) {
      EXPECT_TRUE(seen.insert(sample).second) << "sample " << sample << " read twice";
    }
    position = order.Next(position);
  }
  EXPECT_EQ(seen.size(), 960u);
  EXPECT_EQ(position.epoch, 1);
  EXPECT_EQ(position.sample_offset, 0);
}

// The permutation is part of every checkpoint's meaning: these numbers must not change on any
// platform, compiler or standard library. They were computed by sample_order_reference.py, an
// independent rendering of the algorithm in Python. (A deliberate change of the algorithm
// changes them, and makes old checkpoints resume onto other samples.)
TEST(SampleOrderTest, GoldenValuesAreTheSameEverywhere) {
  const SampleOrder order = MakeOrder(/*seed=*/1234, /*samples=*/1000000, /*global_batch=*/8);
  std::vector<int64_t> epoch0, epoch5;
  for (int64_t i = 0; i < 8; ++i) {
    epoch0.push_back(order.SampleAt(0, i));
    epoch5.push_back(order.SampleAt(5, 999992 + i));
  }
  EXPECT_EQ(epoch0,
            (std::vector<int64_t>{972995, 515284, 93062, 633661, 794479, 567038, 867152, 57082}));
  EXPECT_EQ(epoch5,
            (std::vector<int64_t>{819714, 491183, 679208, 732590, 459539, 10547, 263780, 740982}));
  const SampleOrder small = MakeOrder(/*seed=*/0, /*samples=*/10, /*global_batch=*/1);
  EXPECT_EQ(EpochOrder(small, 0), (std::vector<int64_t>{7, 4, 3, 5, 6, 2, 9, 8, 1, 0}));
}

TEST(SampleOrderTest, ReplicasSplitEachGlobalBatchWhateverTheDegree) {
  constexpr int64_t kSamples = 5000;
  constexpr int64_t kGlobalBatch = 48;
  const SampleOrder single = MakeOrder(99, kSamples, kGlobalBatch);
  for (int degree : {1, 2, 4}) {
    SCOPED_TRACE(absl::StrCat(degree, " replicas"));
    std::vector<SampleOrder> replicas;
    for (int r = 0; r < degree; ++r)
      replicas.push_back(MakeOrder(99, kSamples, kGlobalBatch, degree, r));
    LoaderPosition position = single.Start();
    // Across two epoch boundaries (104 steps an epoch).
    for (int step = 0; step < 250; ++step) {
      std::vector<int64_t> united;
      for (const SampleOrder& replica : replicas) {
        EXPECT_EQ(replica.local_batch_size(), kGlobalBatch / degree);
        const std::vector<int64_t> part = replica.ReplicaBatch(position);
        united.insert(united.end(), part.begin(), part.end());
        EXPECT_EQ(replica.Next(position), single.Next(position));
      }
      ASSERT_EQ(united, single.GlobalBatch(position)) << "step " << step;
      EXPECT_EQ(std::set<int64_t>(united.begin(), united.end()).size(), united.size());
      position = single.Next(position);
    }
    EXPECT_EQ(position.epoch, 2);
  }
}

TEST(SampleOrderTest, AResumedRunReadsWhatAnUninterruptedRunReadsWithAnyDegree) {
  constexpr int64_t kSamples = 3000;
  constexpr int64_t kGlobalBatch = 32;
  constexpr int kSteps = 200;  // two epochs and more (93 steps an epoch)
  // The uninterrupted run, on 2 replicas.
  std::vector<std::vector<int64_t>> expected;
  {
    const SampleOrder r0 = MakeOrder(5, kSamples, kGlobalBatch, 2, 0);
    const SampleOrder r1 = MakeOrder(5, kSamples, kGlobalBatch, 2, 1);
    LoaderPosition position = r0.Start();
    for (int step = 0; step < kSteps; ++step) {
      std::vector<int64_t> batch = r0.ReplicaBatch(position);
      const std::vector<int64_t> other = r1.ReplicaBatch(position);
      batch.insert(batch.end(), other.begin(), other.end());
      expected.push_back(batch);
      position = r0.Next(position);
    }
  }
  for (int stop : {1, 50, 93, 94, 150}) {
    for (int degree : {1, 2, 4}) {
      SCOPED_TRACE(absl::StrCat("stopped after ", stop, " steps, resumed on ", degree));
      // Run `stop` steps, save the position as JSON text (what a checkpoint holds).
      const SampleOrder before = MakeOrder(5, kSamples, kGlobalBatch);
      LoaderPosition position = before.Start();
      for (int step = 0; step < stop; ++step) {
        ASSERT_EQ(before.GlobalBatch(position), expected[step]);
        position = before.Next(position);
      }
      const std::string saved = position.ToJson().dump();
      auto restored_json = LoaderPosition::FromJson(nlohmann::json::parse(saved), "checkpoint");
      ASSERT_TRUE(restored_json.ok()) << restored_json.status();
      EXPECT_EQ(*restored_json, position);
      // Resume with `degree` replicas.
      std::vector<SampleOrder> replicas;
      for (int r = 0; r < degree; ++r) {
        replicas.push_back(MakeOrder(5, kSamples, kGlobalBatch, degree, r));
      }
      auto resumed = replicas[0].Restore(*restored_json);
      ASSERT_TRUE(resumed.ok()) << resumed.status();
      LoaderPosition at = *resumed;
      for (int step = stop; step < kSteps; ++step) {
        std::vector<int64_t> united;
        for (const SampleOrder& replica : replicas) {
          const std::vector<int64_t> part = replica.ReplicaBatch(at);
          united.insert(united.end(), part.begin(), part.end());
        }
        ASSERT_EQ(united, expected[step]) << "step " << step;
        at = replicas[0].Next(at);
      }
    }
  }
}

TEST(SampleOrderTest, RestoreChecksThePositionBelongsToThisOrder) {
  const SampleOrder order = MakeOrder(5, 1000, 100);
  LoaderPosition position = order.Start();
  for (int i = 0; i < 3; ++i) position = order.Next(position);
  EXPECT_EQ(position.sample_offset, 300);
  EXPECT_EQ(*order.Restore(position), position);

  const SampleOrder other_seed = MakeOrder(6, 1000, 100);
  const absl::Status seed = other_seed.Restore(position).status();
  EXPECT_EQ(seed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(seed.message().find("seed 5"), std::string::npos) << seed;
  EXPECT_EQ(MakeOrder(5, 999, 100).Restore(position).status().code(),
            absl::StatusCode::kFailedPrecondition);

  LoaderPosition outside = position;
  outside.sample_offset = 1001;
  EXPECT_EQ(order.Restore(outside).status().code(), absl::StatusCode::kInvalidArgument);

  // A larger global batch that no longer fits in what is left of the epoch: the next epoch.
  const SampleOrder larger = MakeOrder(5, 1000, 800);
  auto moved = larger.Restore(position);
  ASSERT_TRUE(moved.ok());
  EXPECT_EQ(moved->epoch, 1);
  EXPECT_EQ(moved->sample_offset, 0);
}

TEST(SampleOrderTest, PositionsRoundTripThroughJson) {
  LoaderPosition position;
  position.seed = ~0ULL;  // the whole unsigned range survives
  position.epoch = 12;
  position.sample_offset = 4096;
  position.samples_per_epoch = 1 << 30;
  const nlohmann::json json = position.ToJson();
  auto back = LoaderPosition::FromJson(nlohmann::json::parse(json.dump()), "checkpoint");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, position);
  EXPECT_EQ(position.ToString(), "epoch 12, sample 4096 of 1073741824, seed 18446744073709551615");

  for (const char* bad :
       {R"({"epoch": 1, "sample_offset": 0, "samples_per_epoch": 5})",
        R"({"seed": -1, "epoch": 1, "sample_offset": 0, "samples_per_epoch": 5})",
        R"({"seed": 1, "epoch": -1, "sample_offset": 0, "samples_per_epoch": 5})",
        R"({"seed": 1, "epoch": "x", "sample_offset": 0, "samples_per_epoch": 5})", R"([1, 2])"}) {
    auto parsed = LoaderPosition::FromJson(nlohmann::json::parse(bad), "checkpoint.loader");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("checkpoint.loader"), std::string::npos);
  }
}

TEST(SampleOrderTest, RefusesOptionsItCannotHonour) {
  SampleOrderOptions options;
  options.samples_per_epoch = 100;
  options.global_batch_size = 10;
  EXPECT_TRUE(SampleOrder::Create(options).ok());
  SampleOrderOptions bad = options;
  bad.samples_per_epoch = 0;
  EXPECT_FALSE(SampleOrder::Create(bad).ok());
  bad = options;
  bad.global_batch_size = 101;
  EXPECT_FALSE(SampleOrder::Create(bad).ok());
  bad = options;
  bad.data_parallel_degree = 3;  // does not divide 10
  EXPECT_NE(SampleOrder::Create(bad).status().message().find("divide"), std::string::npos);
  bad = options;
  bad.data_parallel_degree = 2;
  bad.replica_index = 2;
  EXPECT_FALSE(SampleOrder::Create(bad).ok());
}

TEST(SampleOrderTest, WithoutShuffleEveryEpochIsTheDataSetOrder) {
  SampleOrderOptions options;
  options.samples_per_epoch = 50;
  options.global_batch_size = 10;
  options.shuffle = false;
  auto order = SampleOrder::Create(options);
  ASSERT_TRUE(order.ok());
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(order->SampleAt(3, i), i);
}

// The pieces together: a data set, its windows, an order, two replicas fetching a step.
TEST(SampleOrderTest, ReplicasFetchTheirSamplesFromTheDataSet) {
  testing::TemporaryFolder folder;
  const std::vector<int64_t> tokens = testing::TestTokens(1, 64 * 10 + 1, 50257);
  testing::WriteBytes(folder.File("a.bin"), testing::LlmcBytes(tokens));
  auto dataset = TokenDataset::Open(folder.path());
  ASSERT_TRUE(dataset.ok());
  SampleWindowOptions window_options;
  window_options.sequence_length = 64;
  auto windows = SampleWindows::Create(*dataset, window_options);
  ASSERT_TRUE(windows.ok());
  ASSERT_EQ(windows->num_samples(), 10);
  const SampleOrder replica1 = MakeOrder(3, windows->num_samples(), 4, 2, 1);
  const std::vector<int64_t> mine = replica1.ReplicaBatch(replica1.Start());
  ASSERT_EQ(mine.size(), 2u);
  std::vector<int64_t> inputs(64), targets(64);
  for (int64_t sample : mine) {
    ASSERT_TRUE(windows->FetchSample(sample, absl::MakeSpan(inputs), absl::MakeSpan(targets)).ok());
    EXPECT_EQ(inputs[0], tokens[sample * 64]);
    EXPECT_EQ(targets[63], tokens[sample * 64 + 64]);
  }
}

}  // namespace
}  // namespace tandem::data
