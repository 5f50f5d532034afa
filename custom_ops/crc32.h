// CRC-32 of a body's bytes (the `body_crc32` attribute, see mlu_fusion_block.h). No onnxruntime
// dependency: the unit tests link it alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace onnxmlu {

// CRC-32 (ISO-HDLC: the checksum of zlib, gzip and PNG; reflected polynomial 0xEDB88320) of
// `size` bytes, continuing from `crc` (0 to start); equals Python's zlib.crc32(data, crc).
uint32_t Crc32(const void* data, size_t size, uint32_t crc = 0) noexcept;

// "0x" and eight lower-case hex digits, as messages print a digest.
std::string Hex32(uint32_t value);

}  // namespace onnxmlu
