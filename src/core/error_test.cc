#include <gtest/gtest.h>

#include "loom/core/error.h"

namespace loom {
namespace {

// One error is one line, and what it echoes cannot drive the terminal.
TEST(Printable, EscapesControlsAndBrokenUtf8KeepsText) {
  EXPECT_EQ(printable("plain text: 42"), "plain text: 42");
  EXPECT_EQ(printable("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(printable(std::string("x\0y", 3)), "x\\x00y");
  EXPECT_EQ(printable("\x1b[2Jgone"), "\\x1b[2Jgone");
  EXPECT_EQ(printable("\x7f"), "\\x7f");
  EXPECT_EQ(printable("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(printable("\xc2\x9b" "31m"), "\\xc2\\x9b31m") << "U+009B, the C1 CSI";
  EXPECT_EQ(printable("\x9b" "31m"), "\\x9b31m") << "a lone 8-bit CSI";
  EXPECT_EQ(printable("\xff\xc3"), "\\xff\\xc3") << "not UTF-8, and a sequence cut short";
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80") << "a surrogate";
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf") << "an overlong '/'";
}

// Sampled text keeps its lines and tabs; every other control, DEL, C1 and broken UTF-8 is
// escaped as in one-line messages (what `loom sample` prints).
TEST(Printable, TextOfSeveralLinesKeepsNewlinesAndTabsOnly) {
  EXPECT_EQ(printable("a\nb\tc", Lines::kKeep), "a\nb\tc");
  EXPECT_EQ(printable("a\rb\x1b]0;t\x07\x7f\x9b\xc2\x9b\xff", Lines::kKeep),
            "a\\rb\\x1b]0;t\\x07\\x7f\\x9b\\xc2\\x9b\\xff");
  EXPECT_EQ(printable("caf\xc3\xa9\n", Lines::kKeep), "caf\xc3\xa9\n");
  EXPECT_EQ(printable("a\nb", Lines::kEscape), printable("a\nb"));
}

}  // namespace
}  // namespace loom
