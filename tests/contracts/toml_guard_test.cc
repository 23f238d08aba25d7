// The guard in front of toml++ 3.3.0: non-ASCII characters pass inside
// strings and comments, nowhere else, and quotes count as strings only where
// toml++ starts one.
#include "contracts/toml_guard.h"

#include <gtest/gtest.h>

#include <string>

namespace trainsup {
namespace {

constexpr char kE[] = "\xc3\xa9";  // U+00E9, in toml++'s undefined range

std::string With(const std::string& before, const std::string& after = "") {
  return before + kE + after;
}

// The error for `text`, which must be refused.
std::string Refused(const std::string& text) {
  absl::Status s = CheckTomlCharacters(text);
  EXPECT_FALSE(s.ok()) << text;
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(s.message());
}

TEST(CheckTomlCharacters, AcceptsNonAsciiInStringsAndComments) {
  const std::string accepted[] = {
      "",
      "a = 1\n",
      With("a = \"", "\""),
      With("a = '", "'"),
      With("a = \"\"\"\n", "\n\"\"\""),
      With("a = '''", "'''"),
      With("a = \"\"\"x\"\"", "\"\"\""),  // two quotes inside, then more text
      With("a = \"\"\"", "\"\"\"\"\""),   // two quotes at the end are content
      With("a = \"\\\"", "\""),           // an escaped quote does not end it
      With("# ", "\na = 1\n"),
      With("a = 1 # ", ""),
      With("\"", "\" = 1"),
      With("a.\"", "\".b = 1"),
      With("1.'", "' = 2"),  // a dotted key whose first segment is digits
      With("[\"", "\"]\nb = 1"),
      With("[[ a . '", "' ]]"),
      With("a = [\n  \"x\", # ", "\n  '") + "',\n]\n",
      With("a = { b = \"", "\", c = [1, 2] }"),
      With("a = [{ b = '", "' }]"),
      With("a = \"\"\"x\\\n   y", "\"\"\""),  // after the continued line's first character
      "\xef\xbb\xbf"
      "a = 1",  // a byte order mark at the start
      With("a = \"\"\"\\u00E9 ", "\"\"\""),
  };
  for (const std::string& text : accepted) {
    EXPECT_TRUE(CheckTomlCharacters(text).ok()) << text << ": " << CheckTomlCharacters(text);
  }
}

TEST(CheckTomlCharacters, RefusesNonAsciiWhereWhitespaceMayStand) {
  const std::pair<std::string, const char*> refused[] = {
      {kE, "line 1, column 1"},
      {With("a = 1 "), "line 1, column 7"},
      {With("", " = 1"), "line 1, column 1"},
      {With("a = [1,", "]"), "line 1, column 8"},
      {With("a = { b = 1 ", "}"), "line 1, column 13"},
      {With("a = \"x\"\n"), "line 2, column 1"},
      {With("[a]\n\"b\"", " = 1"), "line 2, column 4"},
      // A quote after a value's first character is no string: toml++ reads
      // `1'...` on as a number and tests each character for whitespace.
      {With("a = 1'", "'"), "line 1, column 7"},
      {With("a = 1\"", "\""), "line 1, column 7"},
      {With("a = 1.'", "'"), "line 1, column 8"},
      {With("a = +'", "'"), "line 1, column 7"},
      {With("a = 1979-05-27 07'", "'"), "line 1, column 19"},
      {With("a = \"x\"\"", "\""), "line 1, column 9"},
      {With("a = [1] '", "'"), "line 1, column 10"},
      // The end of a multi-line string takes at most five quotes.
      {With("a = \"\"\"x\"\"\"\""), "line 1, column 13"},
      {With("a = '''x'''''"), "line 1, column 14"},
      // Multi-line basic strings: after a backslash, and first on a line
      // continued by one.
      {With("a = \"\"\"\\", "\"\"\""), "line 1, column 9"},
      {With("a = \"\"\"x\\\n", "\"\"\""), "line 2, column 1"},
      {With("a = \"\"\"x\\  \n\n  ", "\"\"\""), "line 3, column 3"},
      {With("a = \"\"\"x\\ "), "line 1, column 11"},
      // A byte order mark is allowed only at the very start.
      {"a = 1\n\xef\xbb\xbf", "U+FEFF at line 2, column 1"},
  };
  for (const auto& [text, where] : refused) {
    const std::string message = Refused(text);
    EXPECT_NE(message.find(where), std::string::npos) << text << ": " << message;
  }
}

TEST(CheckTomlCharacters, NamesTheCharacterAndCountsColumnsInCodePoints) {
  EXPECT_EQ(Refused(With("a = \"\xc3\xbc\xc3\xbc\" ")),
            "non-ASCII character U+00E9 at line 1, column 10 outside a string or comment (TOML "
            "allows non-ASCII characters only in quoted strings and comments)");
  EXPECT_NE(Refused("a = \xf0\x9f\x99\x82").find("U+1F642 at line 1, column 5"), std::string::npos);
  EXPECT_NE(Refused("a = \xff").find("byte 0xFF at line 1, column 5"), std::string::npos);
  EXPECT_NE(Refused("a = \xc3").find("byte 0xC3"), std::string::npos);  // cut short
  EXPECT_NE(Refused(With("a = \"\"\"x\\\n")).find("\\u00E9"), std::string::npos);
}

}  // namespace
}  // namespace trainsup
