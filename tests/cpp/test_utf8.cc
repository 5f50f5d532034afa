// utf8.h: well-formed UTF-8 passes unchanged, every ill-formed byte becomes \xNN (Unicode
// Table 3-7: overlong forms, surrogates, code points above U+10FFFF, truncated sequences).
#include <string>

#include "check.h"
#include "utf8.h"

namespace {

using onnxmlu::Utf8SequenceLength;
using onnxmlu::ValidUtf8;

TEST(utf8_well_formed_text_is_unchanged) {
  CHECK_TEXT(ValidUtf8(""), "");
  CHECK_TEXT(ValidUtf8("conv_1/weights"), "conv_1/weights");
  const std::string text = "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF";  // é € 😀 U+10FFFF
  CHECK_TEXT(ValidUtf8(text), text);
}

TEST(utf8_sequence_lengths) {
  CHECK(Utf8SequenceLength("a", 0) == 1);
  CHECK(Utf8SequenceLength("\xC3\xA9", 0) == 2);
  CHECK(Utf8SequenceLength("\xE2\x82\xAC", 0) == 3);
  CHECK(Utf8SequenceLength("\xF0\x9F\x98\x80", 0) == 4);
  CHECK(Utf8SequenceLength("\x80", 0) == 0);  // a continuation byte alone
  CHECK(Utf8SequenceLength("\xE2\x82", 0) == 0);  // truncated at the end
}

TEST(utf8_ill_formed_bytes_are_escaped) {
  CHECK_TEXT(ValidUtf8("\xFF"), "\\xff");
  CHECK_TEXT(ValidUtf8("a\x80z"), "a\\x80z");
  CHECK_TEXT(ValidUtf8("\xC0\x80"), "\\xc0\\x80");                // overlong NUL
  CHECK_TEXT(ValidUtf8("\xE0\x80\xAF"), "\\xe0\\x80\\xaf");       // overlong '/'
  CHECK_TEXT(ValidUtf8("\xED\xA0\x80"), "\\xed\\xa0\\x80");       // a UTF-16 surrogate
  CHECK_TEXT(ValidUtf8("\xF4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  CHECK_TEXT(ValidUtf8("w\xE2\x82"), "w\\xe2\\x82");              // truncated at the end
  CHECK_TEXT(ValidUtf8("\xC3\xA9\xC3"), "\xC3\xA9\\xc3");         // good then truncated
  CHECK_TEXT(ValidUtf8(std::string("a\0b", 3)), std::string("a\0b", 3));  // NUL is well-formed
}

TEST(utf8_never_reads_past_the_view) {
  // The byte after the view would complete the sequence: a reader that looked past the end would
  // keep "\xE2\x82" as text instead of escaping it.
  const std::string buffer = "w\xE2\x82\xAC";
  CHECK_TEXT(ValidUtf8(std::string_view(buffer.data(), 3)), "w\\xe2\\x82");
  CHECK(Utf8SequenceLength(std::string_view(buffer.data() + 1, 2), 0) == 0);
}

// The error paths' repair into a fixed buffer (no allocation): same text as ValidUtf8 when it
// fits; cut at a whole character or escape, marked "...", when it does not.
TEST(utf8_repair_into_a_fixed_buffer) {
  char out[32];
  CHECK(onnxmlu::ValidUtf8Into(out, sizeof(out), "MLUFusionBlock 'b': ", "bad \xFF") == 28);
  CHECK_TEXT(out, "MLUFusionBlock 'b': bad \\xff");
  char small[12];  // room for 8 bytes, then "..." and the NUL
  onnxmlu::ValidUtf8Into(small, sizeof(small), "abcdef", "\xFFz");
  CHECK_TEXT(small, "abcdef...");  // the 4-byte escape does not fit after 6 bytes: never half of it
  onnxmlu::ValidUtf8Into(small, sizeof(small), "abcd\xE2\x82\xAC", "tail");
  CHECK_TEXT(small, "abcd\xE2\x82\xAC" "t...");  // the euro sign whole, then as much as fits
  char tiny[4];
  onnxmlu::ValidUtf8Into(tiny, sizeof(tiny), "", "");
  CHECK_TEXT(tiny, "");
  onnxmlu::ValidUtf8Into(tiny, sizeof(tiny), "x", "");
  CHECK_TEXT(tiny, "...");
}

TEST(utf8_every_byte_value_gives_well_formed_output) {
  for (int b = 0; b < 256; ++b) {
    for (int c = 0; c < 256; c += 17) {
      const std::string text{static_cast<char>(b), static_cast<char>(c)};
      const std::string out = ValidUtf8(text);
      CHECK(ValidUtf8(out) == out);  // the repair is idempotent: its output is well-formed
    }
  }
}

}  // namespace
