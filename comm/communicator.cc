#include "comm/communicator.h"

#include "absl/strings/str_cat.h"
#include "comm/internal/work_util.h"

namespace tandem::comm {

size_t SizeOf(DataType type) {
  switch (type) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat16: return 2;
    case DataType::kInt8: return 1;
    case DataType::kUInt8: return 1;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
  }
  return 0;
}

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat16: return "float16";
    case DataType::kInt8: return "int8";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
  }
  return "unknown";
}

ShardRange Shard(int64_t count, int size, int rank) {
  if (size <= 0 || rank < 0 || rank >= size || count <= 0) return {};
  const int64_t base = count / size;
  const int64_t extra = count % size;
  ShardRange range;
  range.count = base + (rank < extra ? 1 : 0);
  range.offset = rank * base + (rank < extra ? rank : extra);
  return range;
}

WorkPtr Communicator::SendRecvBatch(const std::vector<PointToPoint>& transfers) {
  std::vector<WorkPtr> parts;
  parts.reserve(transfers.size());
  for (const PointToPoint& t : transfers) {
    parts.push_back(t.kind == PointToPoint::Kind::kSend ? Send(t.buffer, t.peer, t.tag)
                                                        : Recv(t.buffer, t.peer, t.tag));
  }
  return std::make_shared<internal::CombinedWork>(
      std::move(parts), absl::StrCat("batch of ", transfers.size(), " transfers"));
}

}  // namespace tandem::comm
