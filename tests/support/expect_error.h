// expect_error.h — helpers for tests that check an error's message (what was wrong, the values, a hint).
#pragma once

#include <gtest/gtest.h>  // defines: ADD_FAILURE, EXPECT_TRUE

#include <string>
#include <vector>

#include "scalelab/core/error.h"  // defines: scalelab::Error

namespace scalelab::test {

// The what() of the ErrorT (scalelab::Error or a subclass) that f throws; "" and a test failure when
// f throws nothing.
template <typename ErrorT = scalelab::Error, typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const ErrorT& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception, none was thrown";
  return std::string();
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// EXPECT that calling f throws scalelab::Error whose message contains every one of `parts`.
template <typename F>
void expect_error_containing(F&& f, const std::vector<std::string>& parts) {
  const std::string msg = error_message(f);
  for (const std::string& p : parts) EXPECT_TRUE(contains(msg, p)) << "missing '" << p << "' in:\n" << msg;
}

}  // namespace scalelab::test
