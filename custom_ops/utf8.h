// UTF-8 repair of error messages. Messages quote names from the model, and a corrupt body has
// arbitrary bytes in its names; Python decodes status messages as UTF-8 and would raise
// UnicodeDecodeError instead of showing the message. Ill-formed bytes become \xNN. No
// onnxruntime dependency: the unit tests link it alone.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace onnxmlu {

// Length of the well-formed UTF-8 sequence at text[i] (Unicode Table 3-7), 0 when ill-formed.
size_t Utf8SequenceLength(std::string_view text, size_t i) noexcept;

// `text` with every ill-formed byte written as \xNN.
std::string ValidUtf8(std::string_view text);

// The same repair of `first` then `second` into `out` (capacity `size` >= 4, NUL-terminated),
// without allocating: the error paths that run out of memory use it. Text that does not fit is
// cut at a character boundary and ends with "..."; returns the length written.
size_t ValidUtf8Into(char* out, size_t size, std::string_view first, std::string_view second) noexcept;

}  // namespace onnxmlu
