#include "common/json_util.h"

#include <algorithm>

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status.h"

namespace tandem {
namespace {

absl::Status FieldError(absl::string_view where, absl::string_view field,
                        absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(where, ".", field, ": ", problem));
}

absl::StatusOr<const Json*> Find(const Json& object, absl::string_view field,
                                 absl::string_view where) {
  if (!object.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": expected a JSON object"));
  }
  auto it = object.find(std::string(field));
  if (it == object.end()) return FieldError(where, field, "missing field");
  return &*it;
}

}  // namespace

int JsonNestingDepth(absl::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view source) {
  // Deep nesting costs a stack frame a level wherever a value is copied, printed or walked:
  // refused before it is parsed.
  if (const int depth = JsonNestingDepth(text); depth > kMaxJsonDepth) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": JSON nested ", depth,
                                                   " levels deep; at most ", kMaxJsonDepth,
                                                   " are read"));
  }
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Re-parse with exceptions to get nlohmann's position information.
    try {
      Json ignored = Json::parse(text.begin(), text.end());
      (void)ignored;
    } catch (const Json::exception& e) {  // parse_error, or out_of_range for 1e400
      return absl::InvalidArgumentError(absl::StrCat(source, ": malformed JSON: ", e.what()));
    }
    return absl::InvalidArgumentError(absl::StrCat(source, ": malformed JSON"));
  }
  return j;
}

absl::StatusOr<Json> ReadJsonFile(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseJson(text, path);
}

absl::StatusOr<double> GetNumber(const Json& object, absl::string_view field,
                                 absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(const Json* v, Find(object, field, where));
  if (!v->is_number()) return FieldError(where, field, "expected a number");
  double d = v->get<double>();
  if (!std::isfinite(d)) return FieldError(where, field, "expected a finite number");
  return d;
}

absl::StatusOr<double> GetNonNegativeNumber(const Json& object, absl::string_view field,
                                            absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(double d, GetNumber(object, field, where));
  if (d < 0) return FieldError(where, field, absl::StrCat("must not be negative (got ", d, ")"));
  return d;
}

absl::StatusOr<int64_t> GetInt(const Json& object, absl::string_view field,
                               absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(const Json* v, Find(object, field, where));
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{INT64_MAX}) {
    return FieldError(where, field,
                      absl::StrCat("is too large (", v->get<uint64_t>(), " > ", INT64_MAX, ")"));
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::floor(d) == d && std::fabs(d) < 9e15) return static_cast<int64_t>(d);
  }
  return FieldError(where, field, "expected an integer");
}

absl::StatusOr<std::string> GetString(const Json& object, absl::string_view field,
                                      absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(const Json* v, Find(object, field, where));
  if (!v->is_string()) return FieldError(where, field, "expected a string");
  return v->get<std::string>();
}

absl::StatusOr<bool> GetBool(const Json& object, absl::string_view field,
                             absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(const Json* v, Find(object, field, where));
  if (!v->is_boolean()) return FieldError(where, field, "expected true or false");
  return v->get<bool>();
}

absl::StatusOr<std::vector<int64_t>> GetIntArray(const Json& object, absl::string_view field,
                                                 absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(const Json* v, Find(object, field, where));
  if (!v->is_array()) return FieldError(where, field, "expected an array of integers");
  std::vector<int64_t> out;
  for (const Json& e : *v) {
    if (!e.is_number_integer() ||
        (e.is_number_unsigned() && e.get<uint64_t>() > uint64_t{INT64_MAX})) {
      return FieldError(where, field, "expected an array of integers (each at most 2^63 - 1)");
    }
    out.push_back(e.get<int64_t>());
  }
  return out;
}

absl::StatusOr<const Json*> GetArray(const Json& object, absl::string_view field,
                                     absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(const Json* v, Find(object, field, where));
  if (!v->is_array()) return FieldError(where, field, "expected an array");
  return v;
}

absl::StatusOr<const Json*> GetObject(const Json& object, absl::string_view field,
                                      absl::string_view where) {
  TANDEM_ASSIGN_OR_RETURN(const Json* v, Find(object, field, where));
  if (!v->is_object()) return FieldError(where, field, "expected an object");
  return v;
}

absl::StatusOr<double> GetNumberOr(const Json& object, absl::string_view field, double fallback,
                                   absl::string_view where) {
  if (!object.is_object() || !object.contains(std::string(field))) return fallback;
  return GetNumber(object, field, where);
}

absl::StatusOr<int64_t> GetIntOr(const Json& object, absl::string_view field, int64_t fallback,
                                 absl::string_view where) {
  if (!object.is_object() || !object.contains(std::string(field))) return fallback;
  return GetInt(object, field, where);
}

absl::StatusOr<std::string> GetStringOr(const Json& object, absl::string_view field,
                                        absl::string_view fallback, absl::string_view where) {
  if (!object.is_object() || !object.contains(std::string(field))) return std::string(fallback);
  return GetString(object, field, where);
}

bool IsSet(const Json& object, absl::string_view field) {
  if (!object.is_object()) return false;
  const auto it = object.find(std::string(field));
  return it != object.end() && !it->is_null();
}

absl::StatusOr<bool> GetBoolOrUnset(const Json& object, absl::string_view field, bool fallback,
                                    absl::string_view where) {
  if (!IsSet(object, field)) return fallback;
  return GetBool(object, field, where);
}

}  // namespace tandem
