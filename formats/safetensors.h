// Hugging Face safetensors files, read and written without LibTorch.
//
// The format: an 8-byte little-endian unsigned header size N; N bytes of UTF-8 JSON (an object
// mapping each tensor name to {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
// plus an optional "__metadata__" map of strings to strings; padded with spaces); then the data
// buffer, in which each tensor's little-endian, row-major bytes lie at [begin, end).
//
// Reading (SafetensorsFile) maps the file read-only and never reads it whole; the header is
// checked the way the reference implementation (huggingface/safetensors) checks it, and more:
//   * the header size is at most kMaxSafetensorsHeaderBytes and within the file;
//   * the header is a JSON object, nested at most kMaxJsonDepth (common/json_util.h) deep,
//     with no key repeated in any object;
//   * every tensor has a known dtype, a shape of non-negative integers whose element count and
//     byte size do not overflow, and data_offsets [begin, end] with end - begin equal to that
//     byte size;
//   * sorted by offset, the tensors cover the data buffer exactly: no hole, no overlap, the last
//     one ending at the end of the file (so a truncated or padded file is refused).
// Each error is InvalidArgument (NotFound for a missing file or tensor) and names the file and
// the offending key. Extra fields in a tensor's entry are ignored, as the reference does.
//
// Writing (WriteSafetensorsFile) lays the file out as the reference writer does: tensors sorted
// by descending dtype alignment then by name, "__metadata__" first with sorted keys, the header
// padded with spaces to a multiple of 8 bytes, so a file it writes is byte for byte the file
// Python's safetensors writes for the same tensors. A file is written to a temporary name in
// its folder, flushed and renamed, so an error or a crash never leaves a half file under `path`.
//
// Hugging Face folders: a model is either one `model.safetensors` or shards
// `model-00001-of-00003.safetensors` ... listed by `model.safetensors.index.json`
// ({"metadata": {"total_size": ..}, "weight_map": {tensor name: file name}}).
// SafetensorsFolder reads either, opening only the shards that hold the tensors asked for;
// WriteShardedSafetensors writes either, as transformers' save_pretrained does.
//
// Thread safety: a SafetensorsFile is immutable once opened; every const method may be called
// from several threads at once. A SafetensorsFolder may also be used from several threads (it
// opens shards under a lock). The file must not be truncated or rewritten in place while it is
// open (a write through this module replaces it by rename, which is safe): like any mapped
// file, a shrunk one would fault on access.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/json_util.h"

namespace tandem {
class MappedFile;
}  // namespace tandem

namespace tandem::formats {

// The reference implementation refuses larger headers.
inline constexpr int64_t kMaxSafetensorsHeaderBytes = 100'000'000;
// Largest index file (model.safetensors.index.json) read.
inline constexpr int64_t kMaxSafetensorsIndexBytes = int64_t{256} << 20;
// transformers' default largest shard ("5GB").
inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;

// The element types of the format, in the reference's order of increasing alignment (the
// writer sorts by it). Each is written in files by the name DataTypeName gives ("F32").
enum class DataType {
  kBool,           // BOOL
  kFloat4,         // F4 (4 bits, OCP MX)
  kFloat6E2M3,     // F6_E2M3 (6 bits)
  kFloat6E3M2,     // F6_E3M2 (6 bits)
  kUint8,          // U8
  kInt8,           // I8
  kFloat8E5M2,     // F8_E5M2
  kFloat8E4M3,     // F8_E4M3
  kFloat8E8M0,     // F8_E8M0
  kFloat8E4M3Fnuz, // F8_E4M3FNUZ
  kFloat8E5M2Fnuz, // F8_E5M2FNUZ
  kInt16,          // I16
  kUint16,         // U16
  kFloat16,        // F16
  kBfloat16,       // BF16
  kInt32,          // I32
  kUint32,         // U32
  kFloat32,        // F32
  kComplex64,      // C64 (two F32)
  kFloat64,        // F64
  kInt64,          // I64
  kUint64,         // U64
};

// "F32" for kFloat32, and so on.
absl::string_view DataTypeName(DataType type);
// The type a file names; InvalidArgument for a name the format does not define.
absl::StatusOr<DataType> ParseDataType(absl::string_view name);
// Bits per element: 4 and 6 for the sub-byte floats, else 8 times the byte size.
int DataTypeBits(DataType type);
// Whether ReadAsFloat32 converts it (F32, F16, BF16, F64).
bool ConvertsToFloat32(DataType type);

// Exact conversions of 16-bit floats to float (every value, subnormals, infinities; NaNs stay
// NaN), and conversions of float to them rounding to nearest, ties to even, as PyTorch rounds
// (too large a value becomes an infinity). A NaN stays a quiet NaN with its sign and the top of
// its payload (PyTorch writes one canonical NaN instead).
float Bfloat16BitsToFloat32(uint16_t bits);
float Float16BitsToFloat32(uint16_t bits);
uint16_t Float32ToBfloat16Bits(float value);
uint16_t Float32ToFloat16Bits(float value);

// One tensor of a file, as its header describes it.
struct TensorInfo {
  std::string name;
  DataType data_type = DataType::kFloat32;
  std::vector<int64_t> shape;   // [] for a scalar (one element)
  int64_t element_count = 0;    // product of shape
  int64_t byte_offset = 0;      // data_offsets[0]: from the start of the data buffer
  int64_t byte_size = 0;        // data_offsets[1] - data_offsets[0]

  bool operator==(const TensorInfo& other) const {
    return name == other.name && data_type == other.data_type && shape == other.shape &&
           element_count == other.element_count && byte_offset == other.byte_offset &&
           byte_size == other.byte_size;
  }
  bool operator!=(const TensorInfo& other) const { return !(*this == other); }
};

// Indices [begin, end) of one dimension of a tensor, every index of the others: rows
// [r0, r1) of a matrix are {0, r0, r1}, its columns [c0, c1) are {1, c0, c1}. The slice of a
// row-major tensor is returned row-major, with shape[dimension] = end - begin.
struct TensorSlice {
  int dimension = 0;
  int64_t begin = 0;
  int64_t end = 0;
};

// The shape of `slice` of a tensor of shape `shape`; InvalidArgument (naming `tensor_name`)
// for a scalar, a dimension out of range or indices not within 0 <= begin <= end <= size.
absl::StatusOr<std::vector<int64_t>> SliceShape(absl::Span<const int64_t> shape,
                                                const TensorSlice& slice,
                                                absl::string_view tensor_name);

// A safetensors file, mapped read-only and checked on Open. Immutable afterwards: safe to read
// from several threads at once.
class SafetensorsFile {
 public:
  // Maps and checks `path`: NotFound for a missing file, InvalidArgument for anything that is
  // not a regular file or not a valid safetensors file (see the top of this header).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Checks the image of a file held in memory, which must outlive the result (tests, fuzzing,
  // a file received whole). `source` names it in messages.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(
      absl::Span<const uint8_t> bytes, std::string source);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // The path given to Open (or FromBytes' source).
  const std::string& source() const { return source_; }
  // Header size N as stored in the file; the data buffer starts at byte 8 + N.
  int64_t header_bytes() const { return header_bytes_; }
  int64_t data_bytes() const { return data_bytes_; }

  // Names in the order of their data in the file (ties between empty tensors by name).
  const std::vector<std::string>& TensorNamesInFileOrder() const { return names_in_file_order_; }
  // Names sorted by byte value.
  std::vector<std::string> TensorNamesSorted() const;
  bool Contains(absl::string_view name) const;
  // The tensor's description; NotFound naming the file and the tensor.
  absl::StatusOr<const TensorInfo*> Info(absl::string_view name) const;
  // "__metadata__" (empty when absent).
  const std::map<std::string, std::string>& Metadata() const { return metadata_; }

  // The tensor's raw bytes, inside the mapping: valid while this object lives. Not aligned in
  // general (a file whose header size is not a multiple of 8 misaligns every tensor): copy, or
  // use the Read methods, rather than casting the pointer.
  absl::StatusOr<absl::Span<const uint8_t>> Bytes(absl::string_view name) const;

  // Converts the whole tensor (F32, F16, BF16 exactly; F64 rounded to nearest) into `out`,
  // which holds `count` floats: InvalidArgument unless count is the tensor's element count or
  // for another dtype (naming both).
  absl::Status ReadAsFloat32(absl::string_view name, float* out, int64_t count) const;
  // The same for one slice (see TensorSlice): `count` must be the slice's element count.
  // Touches only the pages holding the slice, so a tensor-parallel rank reads only its part.
  absl::Status ReadSliceAsFloat32(absl::string_view name, const TensorSlice& slice, float* out,
                                  int64_t count) const;
  // Copies the raw bytes of one slice into `out` (`byte_count` bytes, which must be the slice's
  // size). InvalidArgument for the sub-byte types, whose slices need not start on a byte.
  absl::Status ReadSliceBytes(absl::string_view name, const TensorSlice& slice, void* out,
                              int64_t byte_count) const;

 private:
  SafetensorsFile() = default;
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(
      std::unique_ptr<SafetensorsFile> file);
  // Calls `copy(source bytes, element offset in the output, elements)` for each contiguous run
  // of the slice, after checking it.
  absl::Status ForEachSliceRun(
      const TensorInfo& info, const TensorSlice& slice, int64_t* element_count,
      const std::function<void(const uint8_t*, int64_t, int64_t)>& copy) const;

  std::string source_;
  std::unique_ptr<MappedFile> mapping_;  // null for FromBytes
  const uint8_t* bytes_ = nullptr;   // the whole file
  int64_t size_ = 0;
  int64_t header_bytes_ = 0;
  int64_t data_bytes_ = 0;
  const uint8_t* data_ = nullptr;    // bytes_ + 8 + header_bytes_
  std::vector<TensorInfo> tensors_;  // in file order
  std::vector<std::string> names_in_file_order_;
  absl::flat_hash_map<std::string, size_t> index_of_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write. Its bytes are little-endian and row-major: either `bytes` (not owned;
// it must stay valid until the write returns) or, when `fill_bytes` is set, produced at write
// time into a buffer of the tensor's size (so a caller can copy one tensor at a time from a
// device instead of holding every host copy at once).
struct TensorToWrite {
  std::string name;
  DataType data_type = DataType::kFloat32;
  std::vector<int64_t> shape;
  absl::Span<const uint8_t> bytes;
  std::function<absl::Status(absl::Span<uint8_t> destination)> fill_bytes;
};

// The bytes a tensor of this type and shape takes; InvalidArgument (naming `tensor_name`) for a
// negative dimension, an overflowing size or a sub-byte type whose size is not whole bytes.
absl::StatusOr<int64_t> TensorByteSize(DataType type, absl::Span<const int64_t> shape,
                                       absl::string_view tensor_name);

// The whole file image in memory (for small files and tests). InvalidArgument, naming the
// tensor, for an empty or repeated name, the name "__metadata__", a name or metadata that is
// not valid UTF-8, a negative dimension, bytes of the wrong size, or a header too large.
absl::StatusOr<std::string> SerializeSafetensors(
    absl::Span<const TensorToWrite> tensors,
    const std::map<std::string, std::string>& metadata = {});

// Writes `path` atomically (temporary file beside it, flushed, renamed; removed on any error,
// and an existing file left as it was). Errors as SerializeSafetensors, plus InvalidArgument
// for a folder that does not exist or a path that is a folder, DataLoss for a failed write, and
// whatever a fill_bytes callback returns.
absl::Status WriteSafetensorsFile(const std::string& path,
                                  absl::Span<const TensorToWrite> tensors,
                                  const std::map<std::string, std::string>& metadata = {});

// A Hugging Face model folder: `model.safetensors`, or `model.safetensors.index.json` with the
// shards it lists. Shards are opened on first use, and checked against the index when opened:
// a tensor that the index maps to a shard must be in it, and every tensor in a shard must be
// mapped to it by the index. Safe to use from several threads at once.
class SafetensorsFolder {
 public:
  inline static constexpr char kIndexFileName[] = "model.safetensors.index.json";
  inline static constexpr char kSingleFileName[] = "model.safetensors";

  // `path` is a folder (its index is used if present, else its model.safetensors), an index
  // file, or a single .safetensors file. NotFound when the folder holds neither; InvalidArgument
  // for a malformed index: not an object, no "weight_map" object, a repeated key, a file name
  // that is not a string, is empty, or leaves the folder ('/', "..").
  static absl::StatusOr<std::unique_ptr<SafetensorsFolder>> Open(const std::string& path);

  // Every tensor name, sorted.
  const std::vector<std::string>& TensorNames() const { return names_; }
  bool Contains(absl::string_view name) const;
  // The index's "metadata" object (total_size, ...); an empty object without an index.
  const Json& IndexMetadata() const { return index_metadata_; }
  // The file holding `name`, relative to the folder; NotFound naming the tensor.
  absl::StatusOr<std::string> FileNameOf(absl::string_view name) const;

  // The opened shard holding `name` (opened now if needed). NotFound for a tensor the index
  // does not list or a shard that does not exist (naming the tensor and the file);
  // InvalidArgument for a shard that is not a valid file or disagrees with the index (a tensor
  // missing from it, or a tensor in it that the index does not map to it, naming that tensor).
  // The pointer stays valid while the folder lives.
  absl::StatusOr<const SafetensorsFile*> FileOf(absl::string_view name) const;

  // SafetensorsFile's methods, through FileOf.
  absl::StatusOr<TensorInfo> Info(absl::string_view name) const;
  absl::StatusOr<absl::Span<const uint8_t>> Bytes(absl::string_view name) const;
  absl::Status ReadAsFloat32(absl::string_view name, float* out, int64_t count) const;
  absl::Status ReadSliceAsFloat32(absl::string_view name, const TensorSlice& slice, float* out,
                                  int64_t count) const;
  absl::Status ReadSliceBytes(absl::string_view name, const TensorSlice& slice, void* out,
                              int64_t byte_count) const;

  // Opens every shard, so that every disagreement between the index and the shards is found
  // now rather than at first use; the first error.
  absl::Status ValidateAll() const;
  // How many shards are open (to see that a read opened only what it needed).
  int OpenedFileCount() const;

 private:
  SafetensorsFolder() = default;
  // The shard `file_name`, opened and checked against the index once.
  absl::StatusOr<const SafetensorsFile*> OpenShard(const std::string& file_name) const;

  std::string folder_;
  std::string index_path_;  // empty for a single file
  Json index_metadata_ = Json::object();
  std::vector<std::string> names_;
  std::map<std::string, std::string, std::less<>> file_of_tensor_;
  std::vector<std::string> file_names_;  // distinct, in first-use order of the index

  mutable absl::Mutex mutex_;
  // Each shard opened so far: the file, or why it could not be used.
  mutable std::map<std::string, absl::StatusOr<std::unique_ptr<SafetensorsFile>>> shards_
      ABSL_GUARDED_BY(mutex_);
};

// Options of WriteShardedSafetensors.
struct ShardedWriteOptions {
  // A shard holds tensors of at most this many bytes in all, unless one tensor alone is larger
  // (it then gets a shard of its own), as transformers splits.
  int64_t max_shard_bytes = kDefaultMaxShardBytes;
  // Prefix of the file names: "model" gives model.safetensors or model-0000N-of-0000M.
  std::string base_name = "model";
  // "__metadata__" of every file; transformers expects {"format": "pt"}.
  std::map<std::string, std::string> metadata = {{"format", "pt"}};
};

// What WriteShardedSafetensors wrote, relative to the folder.
struct ShardedWriteResult {
  std::vector<std::string> files;  // the .safetensors files
  std::string index_file;          // empty when everything fitted in one file
  int64_t total_bytes = 0;         // sum of the tensors' bytes (the index's total_size)
};

// Writes `tensors`, in the order given, into `folder` (created with its parents if missing):
// one <base>.safetensors if they fit in one shard, else <base>-0000N-of-0000M.safetensors and
// <base>.safetensors.index.json. Every tensor is checked before any file is written. Each file
// is written atomically (never a half file) and the index last; then files of an earlier save
// under the same base name that this one did not write (shards, an index, a single file) are
// removed, so the folder holds exactly one model. A save over an earlier one replaces shards
// of the same name before the index: a reader must not open the folder while it is being
// written (as with transformers). Errors as WriteSafetensorsFile; InvalidArgument for
// max_shard_bytes < 1 or a base name that is empty or holds '/'; Internal when a file of the
// earlier save cannot be removed.
absl::StatusOr<ShardedWriteResult> WriteShardedSafetensors(
    const std::string& folder, absl::Span<const TensorToWrite> tensors,
    const ShardedWriteOptions& options = {});

}  // namespace tandem::formats
