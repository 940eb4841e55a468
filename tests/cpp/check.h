// A minimal check harness for the C++ unit tests: CHECK counts failures and
// goes on, finish() reports them as the exit code.
#pragma once

#include <cstdio>

inline int& checkFailures() {
  static int failures = 0;
  return failures;
}

#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++checkFailures();                                                            \
    }                                                                               \
  } while (0)

inline int finish(const char* suite) {
  if (checkFailures()) {
    std::fprintf(stderr, "%s: %d check(s) failed\n", suite, checkFailures());
    return 1;
  }
  std::printf("%s: all checks passed\n", suite);
  return 0;
}
