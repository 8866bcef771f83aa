#include "formats/safetensors.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/file_util.h"
#include "common/mapped_file.h"
#include "common/status.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "formats/safetensors.cc reads little-endian data in place: a big-endian host needs swaps"
#endif

namespace tandem::formats {
namespace {

constexpr int64_t kSizeFieldBytes = 8;
constexpr char kMetadataKey[] = "__metadata__";

struct DataTypeEntry {
  DataType type;
  const char* name;
  int bits;
};

// In enum order.
constexpr DataTypeEntry kDataTypes[] = {
    {DataType::kBool, "BOOL", 8},
    {DataType::kFloat4, "F4", 4},
    {DataType::kFloat6E2M3, "F6_E2M3", 6},
    {DataType::kFloat6E3M2, "F6_E3M2", 6},
    {DataType::kUint8, "U8", 8},
    {DataType::kInt8, "I8", 8},
    {DataType::kFloat8E5M2, "F8_E5M2", 8},
    {DataType::kFloat8E4M3, "F8_E4M3", 8},
    {DataType::kFloat8E8M0, "F8_E8M0", 8},
    {DataType::kFloat8E4M3Fnuz, "F8_E4M3FNUZ", 8},
    {DataType::kFloat8E5M2Fnuz, "F8_E5M2FNUZ", 8},
    {DataType::kInt16, "I16", 16},
    {DataType::kUint16, "U16", 16},
    {DataType::kFloat16, "F16", 16},
    {DataType::kBfloat16, "BF16", 16},
    {DataType::kInt32, "I32", 32},
    {DataType::kUint32, "U32", 32},
    {DataType::kFloat32, "F32", 32},
    {DataType::kComplex64, "C64", 64},
    {DataType::kFloat64, "F64", 64},
    {DataType::kInt64, "I64", 64},
    {DataType::kUint64, "U64", 64},
};

const DataTypeEntry& EntryOf(DataType type) {
  return kDataTypes[static_cast<size_t>(type)];
}

// A name for messages: quoted, control bytes escaped (so a message stays one line), long names
// cut.
std::string Quoted(absl::string_view name) {
  constexpr size_t kLongest = 200;
  std::string out = "'";
  for (size_t i = 0; i < name.size() && i < kLongest; ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (name.size() > kLongest) out += "...";
  out += "'";
  return out;
}

// A JSON value for messages: one line, cut when long.
std::string Excerpt(const Json& value) {
  constexpr size_t kLongest = 80;
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true, Json::error_handler_t::replace);
  if (text.size() > kLongest) text = text.substr(0, kLongest) + "...";
  return text;
}

absl::Status TensorError(absl::string_view source, absl::string_view name,
                         absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(source, ": tensor ", Quoted(name), ": ", problem));
}

bool IsValidUtf8(absl::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    int extra;
    uint32_t code;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      extra = 1;
      code = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      extra = 2;
      code = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      extra = 3;
      code = c & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(extra) >= text.size()) return false;  // cut short
    for (int k = 1; k <= extra; ++k) {
      const unsigned char next = static_cast<unsigned char>(text[i + static_cast<size_t>(k)]);
      if ((next & 0xc0) != 0x80) return false;
      code = (code << 6) | (next & 0x3f);
    }
    static constexpr uint32_t kSmallest[] = {0, 0x80, 0x800, 0x10000};
    if (code < kSmallest[extra] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) {
      return false;  // overlong, beyond Unicode, or a surrogate
    }
    i += static_cast<size_t>(extra) + 1;
  }
  return true;
}

// A JSON string literal for `text` (valid UTF-8), escaped as serde_json escapes it.
std::string JsonString(absl::string_view text) {
  return Json(std::string(text)).dump(-1, ' ', /*ensure_ascii=*/false,
                                      Json::error_handler_t::replace);
}

// Finds the first key repeated within one JSON object, anywhere in a document, without
// building it (nlohmann keeps the last of repeated keys silently).
class RepeatedKeyFinder : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& value) override {
    if (keys_.empty()) return true;
    if (!keys_.back().insert(value).second) {
      repeated_ = value;
      found_ = true;
      return false;  // stops the parse
    }
    return true;
  }
  bool end_object() override {
    if (!keys_.empty()) keys_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

  bool found() const { return found_; }
  const std::string& repeated() const { return repeated_; }

 private:
  std::vector<std::set<std::string>> keys_;
  bool found_ = false;
  std::string repeated_;
};

// Parses JSON text through common's ParseJson (nesting limit, messages with positions), then
// refuses a key repeated within an object.
absl::StatusOr<Json> ParseJsonWithoutRepeatedKeys(absl::string_view text,
                                                  absl::string_view source) {
  TANDEM_ASSIGN_OR_RETURN(Json document, ParseJson(text, source));
  RepeatedKeyFinder finder;
  // Already parsed once, so this parse succeeds unless it is stopped at a repeated key.
  Json::sax_parse(text.begin(), text.end(), &finder, Json::input_format_t::json,
                  /*strict=*/true);
  if (finder.found()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": key ", Quoted(finder.repeated()), " appears twice in one object"));
  }
  return document;
}

absl::StatusOr<uint64_t> NonNegativeInteger(const Json& value, absl::string_view source,
                                            absl::string_view name, absl::string_view field) {
  if (!value.is_number_unsigned()) {
    return TensorError(source, name,
                       absl::StrCat(field, " holds ", Excerpt(value), ", not a non-negative integer"));
  }
  return value.get<uint64_t>();
}

// The entry of one tensor: offsets still unchecked against the buffer.
struct ParsedEntry {
  TensorInfo info;
  uint64_t begin = 0;
  uint64_t end = 0;
};

absl::StatusOr<ParsedEntry> ParseEntry(const std::string& name, const Json& value,
                                       absl::string_view source) {
  if (!value.is_object()) {
    return TensorError(source, name, "expected an object with dtype, shape and data_offsets");
  }
  ParsedEntry entry;
  entry.info.name = name;
  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) {
    return TensorError(source, name, "missing dtype (a string such as \"F32\")");
  }
  const absl::StatusOr<DataType> type = ParseDataType(dtype->get_ref<const std::string&>());
  if (!type.ok()) return TensorError(source, name, type.status().message());
  entry.info.data_type = *type;

  const auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) {
    return TensorError(source, name, "missing shape (an array of non-negative integers)");
  }
  for (const Json& dimension : *shape) {
    TANDEM_ASSIGN_OR_RETURN(const uint64_t size,
                            NonNegativeInteger(dimension, source, name, "shape"));
    if (size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return TensorError(source, name, absl::StrCat("shape holds ", size, ", too large"));
    }
    entry.info.shape.push_back(static_cast<int64_t>(size));
  }

  const auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2) {
    return TensorError(source, name, "missing data_offsets (an array [begin, end])");
  }
  TANDEM_ASSIGN_OR_RETURN(entry.begin,
                          NonNegativeInteger((*offsets)[0], source, name, "data_offsets"));
  TANDEM_ASSIGN_OR_RETURN(entry.end,
                          NonNegativeInteger((*offsets)[1], source, name, "data_offsets"));
  return entry;
}

std::string ShapeText(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Product of `shape` without overflow; nullopt-like -1 when it overflows.
int64_t CheckedProduct(absl::Span<const int64_t> shape) {
  int64_t product = 1;
  for (const int64_t size : shape) {
    if (size < 0 || __builtin_mul_overflow(product, size, &product)) return -1;
  }
  return product;
}

uint64_t ReadLittleEndian64(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

std::string LittleEndian64(uint64_t value) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xff);
  return out;
}

}  // namespace

// ---- Data types ------------------------------------------------------------------------------

absl::string_view DataTypeName(DataType type) { return EntryOf(type).name; }

absl::StatusOr<DataType> ParseDataType(absl::string_view name) {
  for (const DataTypeEntry& entry : kDataTypes) {
    if (name == entry.name) return entry.type;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", Quoted(name)));
}

int DataTypeBits(DataType type) { return EntryOf(type).bits; }

bool ConvertsToFloat32(DataType type) {
  return type == DataType::kFloat32 || type == DataType::kFloat16 ||
         type == DataType::kBfloat16 || type == DataType::kFloat64;
}

float Bfloat16BitsToFloat32(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

float Float16BitsToFloat32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1f;
  const uint32_t mantissa = bits & 0x3ff;
  uint32_t wide;
  if (exponent == 0x1f) {
    wide = sign | 0x7f800000u | (mantissa << 13);  // infinity, or NaN with its payload
  } else if (exponent != 0) {
    wide = sign | ((exponent + 112) << 23) | (mantissa << 13);  // rebias 15 -> 127
  } else {
    // Zero or subnormal: mantissa * 2^-24, exact in a float.
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  float value;
  std::memcpy(&value, &wide, sizeof(value));
  return value;
}

uint16_t Float32ToBfloat16Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040);  // NaN: kept, made quiet
  }
  // Round to nearest even on the 16 bits dropped; a carry rounds up into the exponent, and
  // past the largest finite value into infinity, as it should.
  const uint32_t rounding = 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

uint16_t Float32ToFloat16Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    return static_cast<uint16_t>(sign | 0x7e00 | ((magnitude >> 13) & 0x3ff));  // quiet NaN
  }
  // 65520 = 0x477ff000 is halfway between 65504 (the largest half) and 65536: ties to even
  // round it up, to infinity.
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);
  const uint32_t exponent = magnitude >> 23;
  const uint32_t mantissa = magnitude & 0x7fffff;
  if (exponent >= 113) {  // a normal half (at least 2^-14)
    uint32_t half = ((exponent - 112) << 10) | (mantissa >> 13);
    const uint32_t dropped = mantissa & 0x1fff;
    if (dropped > 0x1000 || (dropped == 0x1000 && (half & 1))) ++half;  // may carry: fine
    return static_cast<uint16_t>(sign | half);
  }
  if (exponent < 102) return sign;  // below 2^-25: rounds to zero
  // Subnormal half: a count of 2^-24 units, (1.mantissa * 2^(exponent-127)) / 2^-24.
  const uint32_t full = mantissa | 0x800000;
  const uint32_t shift = 126 - exponent;  // 14 .. 24
  uint32_t half = full >> shift;
  const uint32_t dropped = full & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (dropped > halfway || (dropped == halfway && (half & 1))) ++half;  // 0x400 is 2^-14: fine
  return static_cast<uint16_t>(sign | half);
}

absl::StatusOr<int64_t> TensorByteSize(DataType type, absl::Span<const int64_t> shape,
                                       absl::string_view tensor_name) {
  for (const int64_t size : shape) {
    if (size < 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", Quoted(tensor_name), ": shape ",
                                                     ShapeText(shape),
                                                     " has a negative dimension"));
    }
  }
  const int64_t elements = CheckedProduct(shape);
  int64_t bits = 0;
  if (elements < 0 || __builtin_mul_overflow(elements, int64_t{DataTypeBits(type)}, &bits)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", Quoted(tensor_name), ": shape ",
                                                   ShapeText(shape), " of ", DataTypeName(type),
                                                   " overflows 64-bit sizes"));
  }
  if (bits % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", Quoted(tensor_name), ": ", elements, " elements of ", DataTypeName(type),
        " are ", bits, " bits, not a whole number of bytes"));
  }
  return bits / 8;
}

absl::StatusOr<std::vector<int64_t>> SliceShape(absl::Span<const int64_t> shape,
                                                const TensorSlice& slice,
                                                absl::string_view tensor_name) {
  const auto error = [&](absl::string_view problem) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", Quoted(tensor_name), " of shape ",
                                                   ShapeText(shape), ": ", problem));
  };
  if (shape.empty()) return error("a scalar has no dimension to slice");
  if (slice.dimension < 0 || static_cast<size_t>(slice.dimension) >= shape.size()) {
    return error(absl::StrCat("no dimension ", slice.dimension, " to slice"));
  }
  const int64_t size = shape[static_cast<size_t>(slice.dimension)];
  if (slice.begin < 0 || slice.begin > slice.end || slice.end > size) {
    return error(absl::StrCat("slice [", slice.begin, ", ", slice.end, ") of dimension ",
                              slice.dimension, " is not within [0, ", size, ")"));
  }
  std::vector<int64_t> sliced(shape.begin(), shape.end());
  sliced[static_cast<size_t>(slice.dimension)] = slice.end - slice.begin;
  return sliced;
}

// ---- Reading ---------------------------------------------------------------------------------

SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  TANDEM_ASSIGN_OR_RETURN(file->mapping_, MappedFile::Open(path));
  file->source_ = path;
  file->size_ = file->mapping_->size_bytes();
  file->bytes_ = file->mapping_->data();
  return Parse(std::move(file));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(
    absl::Span<const uint8_t> bytes, std::string source) {
  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->source_ = std::move(source);
  file->bytes_ = bytes.data();
  file->size_ = static_cast<int64_t>(bytes.size());
  return Parse(std::move(file));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(
    std::unique_ptr<SafetensorsFile> file) {
  const std::string& source = file->source_;
  if (file->size_ < kSizeFieldBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", file->size_,
                     " bytes, too short for a safetensors file (it starts with an 8-byte "
                     "header size)"));
  }
  const uint64_t header_size = ReadLittleEndian64(file->bytes_);
  if (header_size > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": header size ", header_size,
                                                   " bytes is more than the ",
                                                   kMaxSafetensorsHeaderBytes,
                                                   " the format allows"));
  }
  if (header_size > static_cast<uint64_t>(file->size_ - kSizeFieldBytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": header size ", header_size, " bytes runs past the end of the file (",
        file->size_, " bytes): truncated, or not a safetensors file"));
  }
  file->header_bytes_ = static_cast<int64_t>(header_size);
  file->data_bytes_ = file->size_ - kSizeFieldBytes - file->header_bytes_;
  file->data_ = file->bytes_ + kSizeFieldBytes + file->header_bytes_;

  const absl::string_view text(reinterpret_cast<const char*>(file->bytes_ + kSizeFieldBytes),
                               static_cast<size_t>(header_size));
  TANDEM_ASSIGN_OR_RETURN(const Json header,
                          ParseJsonWithoutRepeatedKeys(text, absl::StrCat(source, ": header")));
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": header is ", header.type_name(), ", not a JSON object"));
  }

  std::vector<ParsedEntry> entries;
  entries.reserve(header.size());
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (it->is_null()) continue;
      if (!it->is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": __metadata__ is ", it->type_name(), ", not an object of strings"));
      }
      for (auto field = it->begin(); field != it->end(); ++field) {
        if (!field->is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(source, ": __metadata__.", Quoted(field.key()), " is ",
                           field->type_name(), ", not a string"));
        }
        file->metadata_.emplace(field.key(), field->get<std::string>());
      }
      continue;
    }
    TANDEM_ASSIGN_OR_RETURN(ParsedEntry entry, ParseEntry(it.key(), it.value(), source));
    entries.push_back(std::move(entry));
  }

  // In file order; the tensors must then tile the data buffer.
  std::sort(entries.begin(), entries.end(), [](const ParsedEntry& a, const ParsedEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.info.name < b.info.name;
  });
  const uint64_t data_bytes = static_cast<uint64_t>(file->data_bytes_);
  uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (ParsedEntry& entry : entries) {
    const std::string& name = entry.info.name;
    const std::string offsets = absl::StrCat("data_offsets [", entry.begin, ", ", entry.end, "]");
    if (entry.end < entry.begin) {
      return TensorError(source, name, absl::StrCat(offsets, " end before they begin"));
    }
    if (entry.end > data_bytes) {
      return TensorError(source, name,
                         absl::StrCat(offsets, " run past the end of the data, which has ",
                                      data_bytes, " bytes (truncated file?)"));
    }
    if (entry.begin < covered) {
      return TensorError(source, name,
                         absl::StrCat(offsets, " overlap tensor ", Quoted(*previous),
                                      ", which ends at byte ", covered));
    }
    if (entry.begin > covered) {
      return TensorError(source, name,
                         absl::StrCat(offsets, " leave bytes [", covered, ", ", entry.begin,
                                      ") of the data unused"));
    }
    const absl::StatusOr<int64_t> byte_size =
        TensorByteSize(entry.info.data_type, entry.info.shape, name);
    if (!byte_size.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", byte_size.status().message()));
    }
    if (static_cast<uint64_t>(*byte_size) != entry.end - entry.begin) {
      return TensorError(source, name,
                         absl::StrCat("shape ", ShapeText(entry.info.shape), " of ",
                                      DataTypeName(entry.info.data_type), " takes ", *byte_size,
                                      " bytes but ", offsets, " hold ",
                                      entry.end - entry.begin));
    }
    entry.info.element_count = CheckedProduct(entry.info.shape);
    entry.info.byte_offset = static_cast<int64_t>(entry.begin);
    entry.info.byte_size = *byte_size;
    covered = entry.end;
    previous = &name;
  }
  if (covered != data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": the tensors cover ", covered, " bytes of data but the file holds ",
        data_bytes, " after its header (trailing bytes, or offsets that lie)"));
  }

  file->tensors_.reserve(entries.size());
  for (ParsedEntry& entry : entries) {
    file->index_of_.emplace(entry.info.name, file->tensors_.size());
    file->names_in_file_order_.push_back(entry.info.name);
    file->tensors_.push_back(std::move(entry.info));
  }
  return file;
}

std::vector<std::string> SafetensorsFile::TensorNamesSorted() const {
  std::vector<std::string> names = names_in_file_order_;
  std::sort(names.begin(), names.end());
  return names;
}

bool SafetensorsFile::Contains(absl::string_view name) const {
  return index_of_.find(name) != index_of_.end();
}

absl::StatusOr<const TensorInfo*> SafetensorsFile::Info(absl::string_view name) const {
  const auto it = index_of_.find(name);
  if (it == index_of_.end()) {
    return absl::NotFoundError(absl::StrCat(source_, ": no tensor ", Quoted(name)));
  }
  return &tensors_[it->second];
}

absl::StatusOr<absl::Span<const uint8_t>> SafetensorsFile::Bytes(absl::string_view name) const {
  TANDEM_ASSIGN_OR_RETURN(const TensorInfo* info, Info(name));
  if (info->byte_size == 0) return absl::Span<const uint8_t>();
  return absl::Span<const uint8_t>(data_ + info->byte_offset,
                                   static_cast<size_t>(info->byte_size));
}

absl::Status SafetensorsFile::ForEachSliceRun(
    const TensorInfo& info, const TensorSlice& slice, int64_t* element_count,
    const std::function<void(const uint8_t*, int64_t, int64_t)>& copy) const {
  const absl::StatusOr<std::vector<int64_t>> sliced = SliceShape(info.shape, slice, info.name);
  if (!sliced.ok()) return Annotate(sliced.status(), source_);
  const int bits = DataTypeBits(info.data_type);
  if (bits % 8 != 0) {
    return TensorError(source_, info.name,
                       absl::StrCat(DataTypeName(info.data_type),
                                    " elements are smaller than a byte: not sliced"));
  }
  // An empty tensor has nothing to copy, and its other dimensions may be huge.
  *element_count = info.element_count == 0 ? 0 : CheckedProduct(*sliced);
  if (*element_count == 0) return absl::OkStatus();
  // Every partial product is at most element_count here, so none overflows.
  const size_t dimension = static_cast<size_t>(slice.dimension);
  int64_t outer = 1;
  for (size_t d = 0; d < dimension; ++d) outer *= info.shape[d];
  int64_t inner = 1;
  for (size_t d = dimension + 1; d < info.shape.size(); ++d) inner *= info.shape[d];
  const int64_t element_bytes = bits / 8;
  const int64_t run = (slice.end - slice.begin) * inner;
  const uint8_t* tensor = data_ + info.byte_offset;
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t first = (o * info.shape[dimension] + slice.begin) * inner;
    copy(tensor + first * element_bytes, o * run, run);
  }
  return absl::OkStatus();
}

namespace {

// Converts `count` elements at `source` (any alignment) into floats.
void ConvertToFloat32(DataType type, const uint8_t* source, int64_t count, float* out) {
  const size_t n = static_cast<size_t>(count);
  switch (type) {
    case DataType::kFloat32:
      std::memcpy(out, source, n * sizeof(float));
      return;
    case DataType::kBfloat16:
    case DataType::kFloat16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, source + 2 * i, sizeof(bits));
        out[i] = type == DataType::kBfloat16 ? Bfloat16BitsToFloat32(bits)
                                             : Float16BitsToFloat32(bits);
      }
      return;
    case DataType::kFloat64:
      for (size_t i = 0; i < n; ++i) {
        double value;
        std::memcpy(&value, source + 8 * i, sizeof(value));
        out[i] = static_cast<float>(value);
      }
      return;
    default:
      return;  // refused by the caller
  }
}

}  // namespace

absl::Status SafetensorsFile::ReadAsFloat32(absl::string_view name, float* out,
                                            int64_t count) const {
  TANDEM_ASSIGN_OR_RETURN(const TensorInfo* info, Info(name));
  if (!ConvertsToFloat32(info->data_type)) {
    return TensorError(source_, name,
                       absl::StrCat(DataTypeName(info->data_type),
                                    " is not converted to F32 (only F32, F16, BF16 and F64 are)"));
  }
  if (count != info->element_count) {
    return TensorError(source_, name,
                       absl::StrCat("has ", info->element_count, " elements, not the ", count,
                                    " asked for"));
  }
  if (count > 0) ConvertToFloat32(info->data_type, data_ + info->byte_offset, count, out);
  return absl::OkStatus();
}

absl::Status SafetensorsFile::ReadSliceAsFloat32(absl::string_view name, const TensorSlice& slice,
                                                 float* out, int64_t count) const {
  TANDEM_ASSIGN_OR_RETURN(const TensorInfo* info, Info(name));
  if (!ConvertsToFloat32(info->data_type)) {
    return TensorError(source_, name,
                       absl::StrCat(DataTypeName(info->data_type),
                                    " is not converted to F32 (only F32, F16, BF16 and F64 are)"));
  }
  // Checked before anything is written to `out`.
  const absl::StatusOr<std::vector<int64_t>> sliced = SliceShape(info->shape, slice, info->name);
  if (!sliced.ok()) return Annotate(sliced.status(), source_);
  const int64_t expected = info->element_count == 0 ? 0 : CheckedProduct(*sliced);
  if (count != expected) {
    return TensorError(source_, name,
                       absl::StrCat("slice [", slice.begin, ", ", slice.end, ") of dimension ",
                                    slice.dimension, " has ", expected, " elements, not the ",
                                    count, " asked for"));
  }
  int64_t elements = 0;
  const DataType type = info->data_type;
  return ForEachSliceRun(*info, slice, &elements,
                         [&](const uint8_t* source, int64_t at, int64_t run) {
                           ConvertToFloat32(type, source, run, out + at);
                         });
}

absl::Status SafetensorsFile::ReadSliceBytes(absl::string_view name, const TensorSlice& slice,
                                             void* out, int64_t byte_count) const {
  TANDEM_ASSIGN_OR_RETURN(const TensorInfo* info, Info(name));
  const absl::StatusOr<std::vector<int64_t>> sliced = SliceShape(info->shape, slice, info->name);
  if (!sliced.ok()) return Annotate(sliced.status(), source_);
  const int bits = DataTypeBits(info->data_type);
  if (bits % 8 != 0) {
    return TensorError(source_, name,
                       absl::StrCat(DataTypeName(info->data_type),
                                    " elements are smaller than a byte: not sliced"));
  }
  const int64_t expected = info->element_count == 0 ? 0 : CheckedProduct(*sliced) * (bits / 8);
  if (byte_count != expected) {
    return TensorError(source_, name,
                       absl::StrCat("slice [", slice.begin, ", ", slice.end, ") of dimension ",
                                    slice.dimension, " has ", expected, " bytes, not the ",
                                    byte_count, " asked for"));
  }
  int64_t elements = 0;
  uint8_t* destination = static_cast<uint8_t*>(out);
  const int64_t element_bytes = bits / 8;
  return ForEachSliceRun(*info, slice, &elements,
                         [&](const uint8_t* source, int64_t at, int64_t run) {
                           std::memcpy(destination + at * element_bytes, source,
                                       static_cast<size_t>(run * element_bytes));
                         });
}

// ---- Writing ---------------------------------------------------------------------------------

namespace {

// A checked file layout: the header, and the tensors in the order of their data.
struct Layout {
  std::string header;  // size field, JSON and padding
  std::vector<const TensorToWrite*> order;
  std::vector<int64_t> byte_sizes;  // in `order`
};

absl::StatusOr<Layout> PlanLayout(absl::Span<const TensorToWrite> tensors,
                                  const std::map<std::string, std::string>& metadata) {
  for (const auto& [key, value] : metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metadata ", Quoted(key), ": not valid UTF-8"));
    }
  }
  Layout layout;
  std::set<absl::string_view> names;
  for (const TensorToWrite& tensor : tensors) {
    if (tensor.name.empty()) return absl::InvalidArgumentError("a tensor has an empty name");
    if (tensor.name == kMetadataKey) {
      return absl::InvalidArgumentError("a tensor may not be named __metadata__");
    }
    if (!IsValidUtf8(tensor.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quoted(tensor.name), ": name is not valid UTF-8"));
    }
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quoted(tensor.name), ": name given twice"));
    }
    TANDEM_ASSIGN_OR_RETURN(const int64_t bytes,
                            TensorByteSize(tensor.data_type, tensor.shape, tensor.name));
    if (!tensor.fill_bytes && static_cast<int64_t>(tensor.bytes.size()) != bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", Quoted(tensor.name), ": shape ", ShapeText(tensor.shape), " of ",
          DataTypeName(tensor.data_type), " takes ", bytes, " bytes but ", tensor.bytes.size(),
          " were given"));
    }
    layout.order.push_back(&tensor);
  }
  // As the reference writer: descending alignment (the enum's order), then by name.
  std::stable_sort(layout.order.begin(), layout.order.end(),
                   [](const TensorToWrite* a, const TensorToWrite* b) {
                     if (a->data_type != b->data_type) return a->data_type > b->data_type;
                     return a->name < b->name;
                   });

  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) json += ",";
      first = false;
      absl::StrAppend(&json, JsonString(key), ":", JsonString(value));
    }
    json += "}";
  }
  int64_t offset = 0;
  for (const TensorToWrite* tensor : layout.order) {
    const int64_t bytes = *TensorByteSize(tensor->data_type, tensor->shape, tensor->name);
    int64_t end = 0;
    if (__builtin_add_overflow(offset, bytes, &end)) {
      return absl::InvalidArgumentError("the tensors' sizes add up past 64 bits");
    }
    if (json.size() > 1) json += ",";
    absl::StrAppend(&json, JsonString(tensor->name), ":{\"dtype\":\"",
                    DataTypeName(tensor->data_type), "\",\"shape\":[",
                    absl::StrJoin(tensor->shape, ","), "],\"data_offsets\":[", offset, ",", end,
                    "]}");
    layout.byte_sizes.push_back(bytes);
    offset = end;
  }
  json += "}";
  // Padded with spaces so the data, hence every tensor of the reference's layout, is aligned.
  json.append((8 - json.size() % 8) % 8, ' ');
  if (static_cast<int64_t>(json.size()) > kMaxSafetensorsHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("header of ", json.size(), " bytes is more than the ",
                     kMaxSafetensorsHeaderBytes, " the format allows (too many tensors?)"));
  }
  layout.header = LittleEndian64(json.size()) + json;
  return layout;
}

// The bytes of one tensor of a layout: its span, or what its fill_bytes makes in `scratch`.
absl::StatusOr<absl::Span<const uint8_t>> TensorBytes(const TensorToWrite& tensor,
                                                      int64_t byte_size,
                                                      std::vector<uint8_t>* scratch) {
  if (!tensor.fill_bytes) return tensor.bytes;
  scratch->assign(static_cast<size_t>(byte_size), 0);
  const absl::Status filled = tensor.fill_bytes(absl::MakeSpan(*scratch));
  if (!filled.ok()) return Annotate(filled, absl::StrCat("tensor ", Quoted(tensor.name)));
  return absl::Span<const uint8_t>(*scratch);
}

bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

std::string FolderOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string BaseNameOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string JoinPath(const std::string& folder, const std::string& name) {
  if (folder.empty() || folder == ".") return name;
  return folder.back() == '/' ? folder + name : absl::StrCat(folder, "/", name);
}

// Creates `folder` and its missing parents.
absl::Status MakeFolders(const std::string& folder) {
  if (folder.empty()) return absl::OkStatus();
  struct stat info;
  if (::stat(folder.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(folder, ": is a file, not a folder"));
  }
  const std::string parent = FolderOf(folder);
  if (parent != folder && parent != "." && parent != "/") {
    TANDEM_RETURN_IF_ERROR(MakeFolders(parent));
  }
  if (::mkdir(folder.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::InvalidArgumentError(
        absl::StrCat(folder, ": cannot create the folder: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> SerializeSafetensors(
    absl::Span<const TensorToWrite> tensors, const std::map<std::string, std::string>& metadata) {
  TANDEM_ASSIGN_OR_RETURN(Layout layout, PlanLayout(tensors, metadata));
  std::string image = std::move(layout.header);
  std::vector<uint8_t> scratch;
  for (size_t i = 0; i < layout.order.size(); ++i) {
    TANDEM_ASSIGN_OR_RETURN(const absl::Span<const uint8_t> bytes,
                            TensorBytes(*layout.order[i], layout.byte_sizes[i], &scratch));
    image.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }
  return image;
}

absl::Status WriteSafetensorsFile(const std::string& path,
                                  absl::Span<const TensorToWrite> tensors,
                                  const std::map<std::string, std::string>& metadata) {
  if (path.empty() || path.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': not a file name"));
  }
  const auto annotate = [&](const absl::Status& status) { return Annotate(status, path); };
  absl::StatusOr<Layout> layout = PlanLayout(tensors, metadata);
  if (!layout.ok()) return annotate(layout.status());

  struct stat info;
  const bool exists = ::stat(path.c_str(), &info) == 0;
  if (exists && S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a folder"));
  }
  const std::string folder = FolderOf(path);
  struct stat folder_info;
  if (::stat(folder.c_str(), &folder_info) != 0 || !S_ISDIR(folder_info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": its folder ", folder, " does not exist"));
  }

  static std::atomic<int> counter{0};
  const std::string temporary = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter++);
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot create ", temporary, ": ", std::strerror(errno)));
  }
  if (exists) ::fchmod(fd, info.st_mode & 07777);
  // On any failure: the temporary file goes, `path` stays as it was.
  const auto fail = [&](absl::Status status) {
    ::close(fd);
    ::unlink(temporary.c_str());
    return status;
  };
  const auto write_failed = [&](absl::string_view what) {
    return fail(absl::DataLossError(
        absl::StrCat(path, ": ", what, " failed: ", std::strerror(errno))));
  };
  if (!WriteAll(fd, layout->header.data(), layout->header.size())) return write_failed("write");
  std::vector<uint8_t> scratch;
  for (size_t i = 0; i < layout->order.size(); ++i) {
    absl::StatusOr<absl::Span<const uint8_t>> bytes =
        TensorBytes(*layout->order[i], layout->byte_sizes[i], &scratch);
    if (!bytes.ok()) return fail(annotate(bytes.status()));
    if (!WriteAll(fd, bytes->data(), bytes->size())) return write_failed("write");
  }
  if (::fsync(fd) != 0) return write_failed("flush");
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    return absl::DataLossError(absl::StrCat(path, ": close failed: ", std::strerror(error)));
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    return absl::DataLossError(absl::StrCat(path, ": rename failed: ", std::strerror(error)));
  }
  // The rename itself made durable (best effort: some file systems refuse a folder's fsync).
  const int folder_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (folder_fd >= 0) {
    ::fsync(folder_fd);
    ::close(folder_fd);
  }
  return absl::OkStatus();
}

// ---- Hugging Face folders --------------------------------------------------------------------

namespace {

bool IsRegularFile(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

// Shard file names must stay in the folder.
bool IsPlainFileName(absl::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == absl::string_view::npos && name.find('\0') == absl::string_view::npos;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFolder>> SafetensorsFolder::Open(
    const std::string& path) {
  auto folder = std::unique_ptr<SafetensorsFolder>(new SafetensorsFolder());
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file or folder"));
  }
  std::string single_file;
  if (S_ISDIR(info.st_mode)) {
    folder->folder_ = path;
    const std::string index = JoinPath(path, kIndexFileName);
    const std::string single = JoinPath(path, kSingleFileName);
    if (IsRegularFile(index)) {
      folder->index_path_ = index;
    } else if (IsRegularFile(single)) {
      single_file = single;
    } else {
      return absl::NotFoundError(absl::StrCat(path, ": holds neither ", kIndexFileName, " nor ",
                                              kSingleFileName));
    }
  } else {
    folder->folder_ = FolderOf(path);
    if (absl::EndsWith(path, ".json")) {
      folder->index_path_ = path;
    } else {
      single_file = path;
    }
  }

  if (!single_file.empty()) {
    TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                            SafetensorsFile::Open(single_file));
    const std::string file_name = BaseNameOf(single_file);
    folder->names_ = file->TensorNamesSorted();
    for (const std::string& name : folder->names_) {
      folder->file_of_tensor_.emplace(name, file_name);
    }
    folder->file_names_.push_back(file_name);
    absl::MutexLock lock(&folder->mutex_);
    folder->shards_.emplace(file_name, std::move(file));
    return folder;
  }

  const std::string& index_path = folder->index_path_;
  TANDEM_ASSIGN_OR_RETURN(const std::string text,
                          ReadRegularFile(index_path, kMaxSafetensorsIndexBytes));
  TANDEM_ASSIGN_OR_RETURN(const Json index, ParseJsonWithoutRepeatedKeys(text, index_path));
  if (!index.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index_path, ": is ", index.type_name(), ", not a JSON object"));
  }
  const auto metadata = index.find("metadata");
  if (metadata != index.end() && !metadata->is_null()) {
    if (!metadata->is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": metadata is ", metadata->type_name(), ", not an object"));
    }
    folder->index_metadata_ = *metadata;
  }
  const auto weight_map = index.find("weight_map");
  if (weight_map == index.end() || !weight_map->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        index_path, ": missing weight_map (an object of tensor name to file name)"));
  }
  std::set<std::string> seen_files;
  for (auto it = weight_map->begin(); it != weight_map->end(); ++it) {
    if (!it->is_string() || !IsPlainFileName(it->get_ref<const std::string&>())) {
      return absl::InvalidArgumentError(absl::StrCat(
          index_path, ": weight_map.", Quoted(it.key()), " is ", Excerpt(*it),
          ", not the name of a file in the folder"));
    }
    const std::string& file_name = it->get_ref<const std::string&>();
    folder->names_.push_back(it.key());
    folder->file_of_tensor_.emplace(it.key(), file_name);
    if (seen_files.insert(file_name).second) folder->file_names_.push_back(file_name);
  }
  return folder;  // names_ are sorted: nlohmann keeps an object's keys sorted
}

bool SafetensorsFolder::Contains(absl::string_view name) const {
  return file_of_tensor_.find(name) != file_of_tensor_.end();
}

absl::StatusOr<std::string> SafetensorsFolder::FileNameOf(absl::string_view name) const {
  const auto it = file_of_tensor_.find(name);
  if (it == file_of_tensor_.end()) {
    const std::string& where =
        index_path_.empty() ? JoinPath(folder_, file_names_.front()) : index_path_;
    return absl::NotFoundError(absl::StrCat(where, ": no tensor ", Quoted(name)));
  }
  return it->second;
}

absl::StatusOr<const SafetensorsFile*> SafetensorsFolder::OpenShard(
    const std::string& file_name) const {
  absl::MutexLock lock(&mutex_);
  auto found = shards_.find(file_name);
  if (found == shards_.end()) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> opened =
        SafetensorsFile::Open(JoinPath(folder_, file_name));
    if (opened.ok()) {
      // Index and shard must agree both ways.
      const SafetensorsFile& file = **opened;
      for (const auto& [tensor, file_of_tensor] : file_of_tensor_) {
        if (file_of_tensor == file_name && !file.Contains(tensor)) {
          opened = absl::InvalidArgumentError(
              absl::StrCat(file.source(), ": no tensor ", Quoted(tensor), ", which ",
                           index_path_, " says it holds"));
          break;
        }
      }
      if (opened.ok()) {
        for (const std::string& tensor : file.TensorNamesInFileOrder()) {
          const auto listed = file_of_tensor_.find(tensor);
          if (listed == file_of_tensor_.end()) {
            opened = absl::InvalidArgumentError(absl::StrCat(
                file.source(), ": holds tensor ", Quoted(tensor), ", which ", index_path_,
                " does not list"));
            break;
          }
          if (listed->second != file_name) {
            opened = absl::InvalidArgumentError(absl::StrCat(
                file.source(), ": holds tensor ", Quoted(tensor), ", which ", index_path_,
                " places in ", listed->second));
            break;
          }
        }
      }
    }
    found = shards_.emplace(file_name, std::move(opened)).first;
  }
  if (!found->second.ok()) return found->second.status();
  return found->second->get();
}

absl::StatusOr<const SafetensorsFile*> SafetensorsFolder::FileOf(absl::string_view name) const {
  TANDEM_ASSIGN_OR_RETURN(const std::string file_name, FileNameOf(name));
  absl::StatusOr<const SafetensorsFile*> file = OpenShard(file_name);
  if (!file.ok()) return Annotate(file.status(), absl::StrCat("tensor ", Quoted(name)));
  return file;
}

absl::StatusOr<TensorInfo> SafetensorsFolder::Info(absl::string_view name) const {
  TANDEM_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  TANDEM_ASSIGN_OR_RETURN(const TensorInfo* info, file->Info(name));
  return *info;
}

absl::StatusOr<absl::Span<const uint8_t>> SafetensorsFolder::Bytes(absl::string_view name) const {
  TANDEM_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->Bytes(name);
}

absl::Status SafetensorsFolder::ReadAsFloat32(absl::string_view name, float* out,
                                              int64_t count) const {
  TANDEM_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->ReadAsFloat32(name, out, count);
}

absl::Status SafetensorsFolder::ReadSliceAsFloat32(absl::string_view name,
                                                   const TensorSlice& slice, float* out,
                                                   int64_t count) const {
  TANDEM_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->ReadSliceAsFloat32(name, slice, out, count);
}

absl::Status SafetensorsFolder::ReadSliceBytes(absl::string_view name, const TensorSlice& slice,
                                               void* out, int64_t byte_count) const {
  TANDEM_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileOf(name));
  return file->ReadSliceBytes(name, slice, out, byte_count);
}

absl::Status SafetensorsFolder::ValidateAll() const {
  for (const std::string& file_name : file_names_) {
    TANDEM_RETURN_IF_ERROR(OpenShard(file_name).status());
  }
  return absl::OkStatus();
}

int SafetensorsFolder::OpenedFileCount() const {
  absl::MutexLock lock(&mutex_);
  int opened = 0;
  for (const auto& [name, shard] : shards_) opened += shard.ok() ? 1 : 0;
  return opened;
}

// ---- Sharded writing -------------------------------------------------------------------------

namespace {

std::string ShardFileName(const std::string& base_name, size_t number, size_t count) {
  return absl::StrFormat("%s-%05d-of-%05d.safetensors", base_name, number, count);
}

// Whether `file` is one of the files a save under `base_name` writes.
bool IsModelFileName(absl::string_view file, absl::string_view base_name) {
  if (file == absl::StrCat(base_name, ".safetensors") ||
      file == absl::StrCat(base_name, ".safetensors.index.json")) {
    return true;
  }
  // <base>-NNNNN-of-MMMMM.safetensors
  if (!absl::ConsumePrefix(&file, absl::StrCat(base_name, "-")) ||
      !absl::ConsumeSuffix(&file, ".safetensors")) {
    return false;
  }
  const size_t of = file.find("-of-");
  if (of == absl::string_view::npos || of == 0 || of + 4 == file.size()) return false;
  const auto all_digits = [](absl::string_view text) {
    return std::all_of(text.begin(), text.end(),
                       [](char c) { return absl::ascii_isdigit(static_cast<unsigned char>(c)); });
  };
  return all_digits(file.substr(0, of)) && all_digits(file.substr(of + 4));
}

}  // namespace

absl::StatusOr<ShardedWriteResult> WriteShardedSafetensors(
    const std::string& folder, absl::Span<const TensorToWrite> tensors,
    const ShardedWriteOptions& options) {
  if (options.max_shard_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(folder, ": max_shard_bytes is ", options.max_shard_bytes, "; at least 1"));
  }
  if (options.base_name.empty() || options.base_name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(folder, ": base name ", Quoted(options.base_name), " is not a file name"));
  }
  // Checked whole before anything is written.
  TANDEM_RETURN_IF_ERROR(
      Annotate(PlanLayout(tensors, options.metadata).status(), folder));

  // As transformers splits: in the order given; a tensor larger than a shard gets its own.
  ShardedWriteResult result;
  std::vector<std::vector<TensorToWrite>> shards;
  std::vector<TensorToWrite> current;
  int64_t current_bytes = 0;
  for (const TensorToWrite& tensor : tensors) {
    const int64_t bytes = *TensorByteSize(tensor.data_type, tensor.shape, tensor.name);
    result.total_bytes += bytes;
    if (bytes > options.max_shard_bytes) {
      shards.push_back({tensor});
      continue;
    }
    if (current_bytes + bytes > options.max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(tensor);
    current_bytes += bytes;
  }
  if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

  TANDEM_RETURN_IF_ERROR(MakeFolders(folder));
  Json weight_map = Json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string file_name = shards.size() == 1
                                      ? absl::StrCat(options.base_name, ".safetensors")
                                      : ShardFileName(options.base_name, i + 1, shards.size());
    TANDEM_RETURN_IF_ERROR(
        WriteSafetensorsFile(JoinPath(folder, file_name), shards[i], options.metadata));
    for (const TensorToWrite& tensor : shards[i]) weight_map[tensor.name] = file_name;
    result.files.push_back(file_name);
  }
  if (shards.size() > 1) {
    result.index_file = absl::StrCat(options.base_name, ".safetensors.index.json");
    Json index = {{"metadata", {{"total_size", result.total_bytes}}},
                  {"weight_map", std::move(weight_map)}};
    TANDEM_RETURN_IF_ERROR(
        WriteFileAtomically(JoinPath(folder, result.index_file), index.dump(2) + "\n"));
  }

  // Files of an earlier save that this one did not write would make the folder ambiguous.
  std::set<std::string> written(result.files.begin(), result.files.end());
  if (!result.index_file.empty()) written.insert(result.index_file);
  DIR* listing = ::opendir(folder.c_str());
  if (listing == nullptr) {
    return absl::InternalError(
        absl::StrCat(folder, ": cannot list the folder: ", std::strerror(errno)));
  }
  std::vector<std::string> stale;
  while (const dirent* entry = ::readdir(listing)) {
    const std::string name = entry->d_name;
    if (IsModelFileName(name, options.base_name) && written.count(name) == 0) {
      stale.push_back(name);
    }
  }
  ::closedir(listing);
  for (const std::string& name : stale) {
    const std::string path = JoinPath(folder, name);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(absl::StrCat(
          path, ": cannot remove this file of an earlier save: ", std::strerror(errno)));
    }
  }
  return result;
}

}  // namespace tandem::formats
