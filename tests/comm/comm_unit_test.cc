// Unit tests of the comm module's pure parts: shards, 16-bit float conversions, options and
// the backend table.
#include <cmath>
#include <cstdlib>
#include <limits>

#include "comm/backend.h"
#include "comm/communicator.h"
#include "comm/dtype.h"
#include "comm/options.h"
#include "gtest/gtest.h"

namespace tandem::comm {
namespace {

TEST(ShardTest, CoversRangeWithBalancedContiguousShards) {
  for (int64_t count : {0, 1, 7, 10, 1001}) {
    for (int size : {1, 2, 3, 4, 7}) {
      int64_t next = 0;
      for (int r = 0; r < size; ++r) {
        const ShardRange s = Shard(count, size, r);
        EXPECT_EQ(s.offset, s.count > 0 ? next : s.offset);
        if (s.count > 0) next = s.offset + s.count;
        EXPECT_GE(s.count, count / size);
        EXPECT_LE(s.count, count / size + 1);
      }
      EXPECT_EQ(next, count) << count << " over " << size;
    }
  }
  EXPECT_EQ(Shard(10, 3, 0).count, 4);
  EXPECT_EQ(Shard(10, 3, 2).offset, 7);
  EXPECT_EQ(Shard(10, 3, 5).count, 0);  // invalid rank: empty
}

TEST(DataTypeTest, SizesAndNames) {
  EXPECT_EQ(SizeOf(DataType::kBFloat16), 2u);
  EXPECT_EQ(SizeOf(DataType::kInt64), 8u);
  EXPECT_STREQ(DataTypeName(DataType::kFloat16), "float16");
  EXPECT_EQ((Buffer{nullptr, 10, DataType::kFloat64}).bytes(), 80u);
}

TEST(DataTypeTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f)), 1.0f);
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(-3.5f)), -3.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: goes to 1 + 2^-6.
  EXPECT_EQ(BFloat16ToFloat(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8))),
            1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
}

TEST(DataTypeTest, HalfRoundTripsEveryHalfValue) {
  int mismatches = 0;
  for (uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const float f = HalfToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(f)) continue;
    if (FloatToHalf(f) != bits) ++mismatches;
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(HalfToFloat(FloatToHalf(65504.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(70000.0f))));
  EXPECT_EQ(HalfToFloat(FloatToHalf(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
  // 2049 is halfway between 2048 and 2050: ties to even (2048).
  EXPECT_EQ(HalfToFloat(FloatToHalf(2049.0f)), 2048.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(2051.0f)), 2052.0f);
  EXPECT_EQ(HalfToFloat(FloatToHalf(0.1f)), 0.0999755859375f);
}

TEST(OptionsTest, ParsesTimeouts) {
  EXPECT_EQ(*ParseTimeout("30"), absl::Seconds(30));
  EXPECT_EQ(*ParseTimeout("2m"), absl::Minutes(2));
  EXPECT_EQ(*ParseTimeout("250ms"), absl::Milliseconds(250));
  EXPECT_EQ(ParseTimeout("soon").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTimeout("-1").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseTimeout("inf").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(OptionsTest, EnvironmentOverridesDefaultsAndBadValuesAreNamed) {
  setenv("TANDEM_COMM_TIMEOUT", "45s", 1);
  setenv("TANDEM_COMM_VERIFY", "1", 1);  // the debug check is off by default
  auto options = CommOptions::FromEnvironment();
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->timeout, absl::Seconds(45));
  EXPECT_TRUE(options->verify_collectives);
  EXPECT_NE(DescribeCommEnvironment().find("TANDEM_COMM_TIMEOUT=45s"), std::string::npos);
  setenv("TANDEM_COMM_TIMEOUT", "forever", 1);
  auto bad = CommOptions::FromEnvironment();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("TANDEM_COMM_TIMEOUT"), std::string::npos);
  unsetenv("TANDEM_COMM_TIMEOUT");
  unsetenv("TANDEM_COMM_VERIFY");
  EXPECT_EQ(CommOptions::FromEnvironment()->timeout, kDefaultCommTimeout);
  EXPECT_FALSE(CommOptions::FromEnvironment()->verify_collectives);
  // The listing gives the defaults the options really have.
  EXPECT_NE(DescribeCommEnvironment().find("TANDEM_COMM_VERIFY=(unset) [default 0]"),
            std::string::npos)
      << DescribeCommEnvironment();
}

TEST(OptionsTest, SharedGpuModeComesFromTheEnvironment) {
  EXPECT_EQ(CommOptions().shared_gpu, SharedGpuMode::kAuto);
  setenv("TANDEM_COMM_SHARED_GPU", "mpi", 1);
  EXPECT_EQ(CommOptions::FromEnvironment()->shared_gpu, SharedGpuMode::kMpi);
  setenv("TANDEM_COMM_SHARED_GPU", "nccl", 1);
  EXPECT_EQ(CommOptions::FromEnvironment()->shared_gpu, SharedGpuMode::kNccl);
  setenv("TANDEM_COMM_SHARED_GPU", "always", 1);
  auto bad = CommOptions::FromEnvironment();
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("TANDEM_COMM_SHARED_GPU"), std::string::npos);
  EXPECT_NE(bad.status().message().find("'always'"), std::string::npos);
  unsetenv("TANDEM_COMM_SHARED_GPU");
  EXPECT_EQ(CommOptions::FromEnvironment()->shared_gpu, SharedGpuMode::kAuto);
  EXPECT_TRUE(CommOptions::FromEnvironment()->nccl_pair_links);
  setenv("TANDEM_COMM_NCCL_LINKS", "0", 1);
  EXPECT_FALSE(CommOptions::FromEnvironment()->nccl_pair_links);
  setenv("TANDEM_COMM_NCCL_LINKS", "yes", 1);
  EXPECT_EQ(CommOptions::FromEnvironment().status().code(), absl::StatusCode::kInvalidArgument);
  unsetenv("TANDEM_COMM_NCCL_LINKS");
  EXPECT_STREQ(SharedGpuModeName(SharedGpuMode::kNccl), "nccl");
}

TEST(BackendTest, NcclVersionsAreNamedAsNcclPrintsThem) {
  EXPECT_EQ(NcclVersionName(23007), "2.30.7");
  EXPECT_EQ(NcclVersionName(22809), "2.28.9");
  EXPECT_EQ(NcclVersionName(2708), "2.7.8");  // before 2.9: X*1000 + Y*100 + Z
  EXPECT_EQ(NcclVersionName(0), "none");
  EXPECT_EQ(kNcclMultiRankGpuVersion, 23000);
}

TEST(BackendTest, RanksSharingAGpuUseNcclFromRelease230Only) {
  std::string why;
  // auto: NCCL from 2.30, host staging before, with the reason.
  EXPECT_TRUE(*SharedGpuOverNccl(SharedGpuMode::kAuto, 23007, &why));
  EXPECT_TRUE(*SharedGpuOverNccl(SharedGpuMode::kAuto, 23000, &why));
  EXPECT_FALSE(*SharedGpuOverNccl(SharedGpuMode::kAuto, 22809, &why));
  EXPECT_NE(why.find("NCCL 2.28.9 is loaded"), std::string::npos) << why;
  EXPECT_NE(why.find(">= 2.30"), std::string::npos) << why;
  EXPECT_FALSE(*SharedGpuOverNccl(SharedGpuMode::kAuto, 0, &why));
  EXPECT_NE(why.find("no NCCL"), std::string::npos) << why;
  // mpi: host staging whatever NCCL is loaded.
  EXPECT_FALSE(*SharedGpuOverNccl(SharedGpuMode::kMpi, 23007, &why));
  EXPECT_NE(why.find("TANDEM_COMM_SHARED_GPU=mpi"), std::string::npos) << why;
  // nccl: the mode, or an error naming the NCCL loaded.
  EXPECT_TRUE(*SharedGpuOverNccl(SharedGpuMode::kNccl, 23100, &why));
  auto refused = SharedGpuOverNccl(SharedGpuMode::kNccl, 22809, &why);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("2.28.9"), std::string::npos) << refused.status();
  // A build without NCCL reports none at run time.
  if (!BackendCompiled(BackendKind::kNccl)) EXPECT_EQ(NcclRuntimeVersion(), 0);
}

TEST(BackendTest, TableNamesAndParses) {
  EXPECT_EQ(*ParseBackendKind("mpi"), BackendKind::kMpi);
  EXPECT_EQ(*ParseBackendKind("nccl"), BackendKind::kNccl);
  auto bad = ParseBackendKind("gloo");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("mpi, nccl"), std::string::npos);
  EXPECT_STREQ(BackendName(BackendKind::kNccl), "nccl");
}

}  // namespace
}  // namespace tandem::comm
