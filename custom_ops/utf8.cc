#include "utf8.h"

namespace onnxmlu {

size_t Utf8SequenceLength(std::string_view text, size_t i) noexcept {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the first continuation byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return length;
}

namespace {

// Calls `emit(piece)` for each well-formed sequence of `text` and each \xNN escape, in order.
template <typename Emit>
void Repair(std::string_view text, Emit&& emit) {
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < text.size();) {
    if (size_t length = Utf8SequenceLength(text, i)) {
      emit(text.substr(i, length));
      i += length;
      continue;
    }
    const auto value = static_cast<unsigned char>(text[i++]);
    const char escape[4] = {'\\', 'x', kHex[value >> 4], kHex[value & 0xF]};
    emit(std::string_view(escape, 4));
  }
}

}  // namespace

std::string ValidUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  Repair(text, [&](std::string_view piece) { out.append(piece); });
  return out;
}

size_t ValidUtf8Into(char* out, size_t size, std::string_view first, std::string_view second) noexcept {
  const size_t room = size - 4;  // kept for "..." and the NUL
  size_t used = 0;
  bool cut = false;
  const auto emit = [&](std::string_view piece) {
    if (cut || used + piece.size() > room) {
      cut = true;
      return;
    }
    for (char c : piece) out[used++] = c;
  };
  Repair(first, emit);
  Repair(second, emit);
  if (cut) {
    for (char c : {'.', '.', '.'}) out[used++] = c;
  }
  out[used] = '\0';
  return used;
}

}  // namespace onnxmlu
