// CRC-32 by "slicing by 16": sixteen 256-entry tables, 16 input bytes per step (about 1 cycle
// per 2 bytes, no CPU-specific instructions). kCrcTables[0] is the classic byte-at-a-time table;
// kCrcTables[k][b] is the CRC of byte b followed by k zero bytes.
#include "crc32.h"

#include <array>

namespace onnxmlu {

namespace {

using CrcTables = std::array<std::array<uint32_t, 256>, 16>;

constexpr CrcTables MakeCrcTables() {
  CrcTables tables{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t c = b;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    tables[0][b] = c;
  }
  for (size_t k = 1; k < tables.size(); ++k) {
    for (uint32_t b = 0; b < 256; ++b) tables[k][b] = (tables[k - 1][b] >> 8) ^ tables[0][tables[k - 1][b] & 0xFF];
  }
  return tables;
}

constexpr CrcTables kCrcTables = MakeCrcTables();

inline uint32_t LoadLittle32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;  // compilers turn this into one load on little-endian CPUs
}

}  // namespace

uint32_t Crc32(const void* data, size_t size, uint32_t crc) noexcept {
  const auto& t = kCrcTables;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (; size >= 16; size -= 16, p += 16) {
    const uint32_t a = LoadLittle32(p) ^ c, b = LoadLittle32(p + 4), d = LoadLittle32(p + 8), e = LoadLittle32(p + 12);
    c = t[15][a & 0xFF] ^ t[14][(a >> 8) & 0xFF] ^ t[13][(a >> 16) & 0xFF] ^ t[12][a >> 24] ^
        t[11][b & 0xFF] ^ t[10][(b >> 8) & 0xFF] ^ t[9][(b >> 16) & 0xFF] ^ t[8][b >> 24] ^
        t[7][d & 0xFF] ^ t[6][(d >> 8) & 0xFF] ^ t[5][(d >> 16) & 0xFF] ^ t[4][d >> 24] ^
        t[3][e & 0xFF] ^ t[2][(e >> 8) & 0xFF] ^ t[1][(e >> 16) & 0xFF] ^ t[0][e >> 24];
  }
  for (; size > 0; --size, ++p) c = t[0][(c ^ *p) & 0xFF] ^ (c >> 8);
  return ~c;
}

std::string Hex32(uint32_t value) {
  static const char kHex[] = "0123456789abcdef";
  std::string text = "0x00000000";
  for (int i = 9; i >= 2; --i, value >>= 4) text[i] = kHex[value & 0xF];
  return text;
}

}  // namespace onnxmlu
