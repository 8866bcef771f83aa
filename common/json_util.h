// JSON helpers over nlohmann::json that turn missing or mistyped fields into
// InvalidArgument statuses naming the source and the field path ("plan.json: stages[2].ranks:
// expected an array of integers").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace tandem {

using Json = nlohmann::json;

// Deepest nesting of arrays and objects any input may have (tandem's formats use a handful).
inline constexpr int kMaxJsonDepth = 256;
// The deepest nesting of arrays and objects in `text` (brackets inside strings not counted).
int JsonNestingDepth(absl::string_view text);

// Parses text; `source` (a file name) prefixes error messages. Nesting beyond kMaxJsonDepth is
// InvalidArgument, before it is parsed.
absl::StatusOr<Json> ParseJson(absl::string_view text, absl::string_view source);
absl::StatusOr<Json> ReadJsonFile(const std::string& path);

// Field accessors. `where` is the path of `object` for messages ("plan.json: stages[1]").
absl::StatusOr<double> GetNumber(const Json& object, absl::string_view field,
                                 absl::string_view where);
absl::StatusOr<double> GetNonNegativeNumber(const Json& object, absl::string_view field,
                                            absl::string_view where);
absl::StatusOr<int64_t> GetInt(const Json& object, absl::string_view field,
                               absl::string_view where);
absl::StatusOr<std::string> GetString(const Json& object, absl::string_view field,
                                      absl::string_view where);
absl::StatusOr<bool> GetBool(const Json& object, absl::string_view field,
                             absl::string_view where);
absl::StatusOr<std::vector<int64_t>> GetIntArray(const Json& object, absl::string_view field,
                                                 absl::string_view where);
// Returns the array or object at `field`, or an error.
absl::StatusOr<const Json*> GetArray(const Json& object, absl::string_view field,
                                     absl::string_view where);
absl::StatusOr<const Json*> GetObject(const Json& object, absl::string_view field,
                                      absl::string_view where);

// Optional variants: the default when the field is absent, an error when present but mistyped.
absl::StatusOr<double> GetNumberOr(const Json& object, absl::string_view field, double fallback,
                                   absl::string_view where);
absl::StatusOr<int64_t> GetIntOr(const Json& object, absl::string_view field, int64_t fallback,
                                 absl::string_view where);
absl::StatusOr<std::string> GetStringOr(const Json& object, absl::string_view field,
                                        absl::string_view fallback, absl::string_view where);

// For files written by Python tools (transformers' config.json, tokenizer.json), where null
// means unset as much as an absent field does: whether `field` holds a value other than null,
// and a boolean that takes the default when the field is absent or null.
bool IsSet(const Json& object, absl::string_view field);
absl::StatusOr<bool> GetBoolOrUnset(const Json& object, absl::string_view field, bool fallback,
                                    absl::string_view where);

}  // namespace tandem
