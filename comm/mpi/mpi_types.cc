#include "comm/mpi/mpi_types.h"

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "comm/check.h"
#include "comm/dtype.h"

namespace tandem::comm::mpi_internal {
namespace {

struct SixteenBitTypes {
  MPI_Datatype bfloat16 = MPI_DATATYPE_NULL;
  MPI_Datatype float16 = MPI_DATATYPE_NULL;
  MPI_Op sum = MPI_OP_NULL;
  MPI_Op max = MPI_OP_NULL;
  MPI_Op min = MPI_OP_NULL;
  absl::Status status;
};

enum class Combine { kSum, kMax, kMin };

template <Combine kCombine>
void Reduce16(void* in, void* inout, int* len, MPI_Datatype* datatype);

SixteenBitTypes& Types();

template <Combine kCombine>
float CombineValues(float a, float b) {
  if (kCombine == Combine::kSum) return a + b;
  if (kCombine == Combine::kMax) return std::max(a, b);
  return std::min(a, b);
}

template <Combine kCombine>
void Reduce16(void* in, void* inout, int* len, MPI_Datatype* datatype) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  const bool is_bfloat16 = *datatype == Types().bfloat16;
  for (int i = 0; i < *len; ++i) {
    if (is_bfloat16) {
      b[i] = FloatToBFloat16(CombineValues<kCombine>(BFloat16ToFloat(a[i]), BFloat16ToFloat(b[i])));
    } else {
      b[i] = FloatToHalf(CombineValues<kCombine>(HalfToFloat(a[i]), HalfToFloat(b[i])));
    }
  }
}

absl::Status CreateTypes(SixteenBitTypes& types) {
  constexpr int kBytes = 2;
  TANDEM_MPI_CHECK(MPI_Type_contiguous(kBytes, MPI_BYTE, &types.bfloat16));
  TANDEM_MPI_CHECK(MPI_Type_commit(&types.bfloat16));
  TANDEM_MPI_CHECK(MPI_Type_contiguous(kBytes, MPI_BYTE, &types.float16));
  TANDEM_MPI_CHECK(MPI_Type_commit(&types.float16));
  constexpr int kCommutative = 1;
  TANDEM_MPI_CHECK(MPI_Op_create(&Reduce16<Combine::kSum>, kCommutative, &types.sum));
  TANDEM_MPI_CHECK(MPI_Op_create(&Reduce16<Combine::kMax>, kCommutative, &types.max));
  TANDEM_MPI_CHECK(MPI_Op_create(&Reduce16<Combine::kMin>, kCommutative, &types.min));
  return absl::OkStatus();
}

SixteenBitTypes& Types() {
  static SixteenBitTypes* types = [] {
    auto* t = new SixteenBitTypes;  // lives until exit: MPI frees its objects at finalize
    t->status = CreateTypes(*t);
    return t;
  }();
  return *types;
}

}  // namespace

MPI_Datatype BuiltinMpiType(DataType type) {
  switch (type) {
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kBFloat16:
    case DataType::kFloat16: break;
  }
  return MPI_DATATYPE_NULL;
}

absl::StatusOr<MPI_Datatype> ToMpiType(DataType type) {
  if (MPI_Datatype builtin = BuiltinMpiType(type); builtin != MPI_DATATYPE_NULL) return builtin;
  if (type == DataType::kBFloat16 || type == DataType::kFloat16) {
    SixteenBitTypes& types = Types();
    if (!types.status.ok()) return types.status;
    return type == DataType::kBFloat16 ? types.bfloat16 : types.float16;
  }
  return absl::InvalidArgumentError("unknown data type");
}

absl::StatusOr<MPI_Op> ToMpiOp(ReduceOp op, DataType type) {
  const bool sixteen_bit = type == DataType::kBFloat16 || type == DataType::kFloat16;
  if (sixteen_bit) {
    SixteenBitTypes& types = Types();
    if (!types.status.ok()) return types.status;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: return types.sum;
      case ReduceOp::kMax: return types.max;
      case ReduceOp::kMin: return types.min;
    }
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return absl::InvalidArgumentError("unknown reduction");
}

}  // namespace tandem::comm::mpi_internal
