// The doctest runner shared by every test binary (compiled once). A binary
// re-executed as a child process (tests/child_process.h) runs its child
// routine instead of the test suite.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "child_process.h"

int main(int argc, char **argv) {
  if (int rc = chi_test::MaybeRunChild(); rc >= 0) return rc;
  doctest::Context context(argc, argv);
  return context.run();
}
