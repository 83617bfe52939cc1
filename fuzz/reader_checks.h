// What every file reader promises a fuzz target (DESIGN.md section 5): bad bytes end in an
// InputError whose message names the file; nothing else escapes (a library's exception, a
// signal, a read past the input). The message is one line once printed: every error line
// passes through printable(), which escapes the newlines an echoed input may hold.
// Header-only, for the targets under fuzz/.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "loom/core/error.h"

namespace loom::fuzz {

// A broken property: says which, with the text that shows it, and aborts (libFuzzer then
// saves the input as a reproducer).
[[noreturn]] inline void finding(const char* property, const std::string& shown) {
  std::fprintf(stderr, "finding: %s\n%s\n", property, shown.c_str());
  std::abort();
}

// A finding unless `e` names `file`.
inline void check_input_error(const InputError& e, const std::string& file) {
  const std::string what = e.what();
  if (what.find(file) == std::string::npos) finding("an error that does not name the file", what);
}

}  // namespace loom::fuzz
