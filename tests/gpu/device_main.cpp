// Runner of the device tests: without a usable CUDA device it prints why and exits with 77, which
// ctest (SKIP_RETURN_CODE) reports as "Skipped", so a machine without a GPU never counts these
// tests as passed. Listing the tests (catch_discover_tests at build time) needs no device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

#include "gpu/device_support.hpp"

int main(int argc, char** argv) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  const Catch::ConfigData& c = session.configData();
  const bool listing =
      c.listTests || c.listTestNamesOnly || c.listTags || c.listReporters || c.showHelp;
  if (!listing) {
    if (const auto reason = moekit::gpu_test::no_device_reason()) {
      std::cout << "SKIPPED: " << *reason << "\n";
      return moekit::gpu_test::skip_status;
    }
    std::cout << moekit::gpu_test::device_description() << "\n";
  }
  return session.run();
}
