// crc32.h: known vectors (zlib's crc32), continuation, and the sliced loop against the bitwise
// definition at every length and alignment around its 16-byte step.
#include <string>
#include <vector>

#include "check.h"
#include "crc32.h"

namespace {

using onnxmlu::Crc32;

uint32_t Crc(const std::string& text) { return Crc32(text.data(), text.size()); }

// The definition, one bit at a time (reflected polynomial 0xEDB88320).
uint32_t BitwiseCrc32(const unsigned char* data, size_t size) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) {
    c ^= data[i];
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(crc32_known_vectors) {
  CHECK(Crc("") == 0u);
  CHECK(Crc("a") == 0xE8B7BE43u);
  CHECK(Crc("123456789") == 0xCBF43926u);  // the CRC-32/ISO-HDLC check value
  CHECK(Crc("The quick brown fox jumps over the lazy dog") == 0x414FA339u);
  CHECK(Crc(std::string(32, '\0')) == 0x190A55ADu);
}

TEST(crc32_continues_from_a_previous_value) {
  const std::string text = "The quick brown fox jumps over the lazy dog";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const uint32_t first = Crc32(text.data(), cut);
    CHECK(Crc32(text.data() + cut, text.size() - cut, first) == Crc(text));
  }
}

TEST(crc32_sliced_loop_equals_the_bitwise_definition) {
  std::vector<unsigned char> data(300);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131 + 7);
  for (size_t offset = 0; offset < 16; ++offset) {
    for (size_t size = 0; size + offset <= 70; ++size) {
      CHECK(Crc32(data.data() + offset, size) == BitwiseCrc32(data.data() + offset, size));
    }
  }
  CHECK(Crc32(data.data(), data.size()) == BitwiseCrc32(data.data(), data.size()));
}

TEST(hex32_prints_eight_digits) {
  CHECK_TEXT(onnxmlu::Hex32(0), "0x00000000");
  CHECK_TEXT(onnxmlu::Hex32(0xCBF43926u), "0xcbf43926");
  CHECK_TEXT(onnxmlu::Hex32(0xFFFFFFFFu), "0xffffffff");
}

}  // namespace
