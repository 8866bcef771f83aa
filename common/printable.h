// Text from an input file, made safe to show in a message or a JSON string.
#pragma once

#include <cstddef>
#include <string>

#include "absl/strings/string_view.h"

namespace tandem {

// `text` as it may be shown in a message or a JSON string: valid UTF-8 other than control
// characters is kept, newlines and tabs too; every other byte becomes \xNN. Longer than
// `max_bytes`, it is cut there (at a character boundary) and "..." appended. Readers quote
// what they could not parse through this, so a binary file never reaches the terminal.
std::string Printable(absl::string_view text, size_t max_bytes = 4096);

}  // namespace tandem
