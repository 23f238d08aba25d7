// A guard in front of toml++ 3.3.0, the TOML parser of the run spec and the
// daemon's config (Debian's package, which we keep). On some non-ASCII
// characters where whitespace may stand (a bare U+00E9 is enough: every
// code point in U+00A1..U+0499, U+2C4E..U+3047 but U+3000, and
// U+FB46..U+FEFE), its is_non_ascii_horizontal_whitespace() reaches
// TOML_UNREACHABLE, which is undefined behaviour (fixed upstream after
// 3.3.0). Valid TOML has non-ASCII characters only inside strings and
// comments, so refusing them anywhere else first costs nothing valid.
// fuzz/toml_fuzzer.cc runs toml++ under UBSan behind this guard.
//
// Which quote starts a string is decided as toml++ decides it: only where a
// key segment or a value may begin (line start, after '=', '.' in a key,
// '[', '{', ','); a quote anywhere else (after "1" in `a = 1'x'`, which
// toml++ reads on as part of a number) is not a string, so what follows it
// is checked. Inside a multi-line basic string two more places call the
// whitespace test: the character after a backslash, and the first character
// after a line-ending backslash's whitespace and line breaks; both must be
// ASCII (write `\u00E9` there instead).
#ifndef TRAINSUP_CONTRACTS_TOML_GUARD_H_
#define TRAINSUP_CONTRACTS_TOML_GUARD_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace trainsup {

// OK when `text` may be given to toml++; else InvalidArgument
// "non-ASCII character U+00E9 at line L, column C outside a string or
// comment ..." (lines and columns from 1, columns in code points, as toml++
// counts them). A UTF-8 byte order mark at the very start is allowed
// (toml++ skips it). Says nothing about whether the text is valid TOML.
absl::Status CheckTomlCharacters(absl::string_view text);

}  // namespace trainsup

#endif  // TRAINSUP_CONTRACTS_TOML_GUARD_H_
