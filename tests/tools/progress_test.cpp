#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "moekit/tools/progress.hpp"

using namespace moekit::tools;

TEST_CASE("progress: bytes and durations formatted for people", "[tools][progress]") {
  CHECK(format_bytes(512) == "512 B");
  CHECK(format_bytes(1536) == "1.50 KiB");                // 1536 / 1024
  CHECK(format_bytes(150.0 * 1024 * 1024) == "150 MiB");  // three digits, no decimals
  CHECK(format_bytes(3.25 * 1024 * 1024 * 1024) == "3.25 GiB");
  CHECK(format_duration(7) == "0:07");
  CHECK(format_duration(750) == "12:30");  // 12 * 60 + 30
  CHECK(format_duration(3723) == "1:02:03");
  CHECK(format_duration(-5) == "0:00");
}

TEST_CASE("progress: the time left is the elapsed time scaled by what remains",
          "[tools][progress]") {
  // 25 of 100 in 10 s: 75 left at 2.5 a second = 30 s.
  REQUIRE(eta_seconds(25, 100, 10.0));
  CHECK(*eta_seconds(25, 100, 10.0) == Approx(30.0));
  CHECK(*eta_seconds(1, 3, 2.0) == Approx(4.0));
  CHECK(*eta_seconds(100, 100, 10.0) == 0.0);
  CHECK_FALSE(eta_seconds(0, 100, 10.0));  // nothing done yet: no rate
  CHECK_FALSE(eta_seconds(5, 0, 10.0));    // total unknown
  CHECK_FALSE(eta_seconds(5, 10, 0.0));    // no time has passed
}

TEST_CASE("progress: one line with bar, counts, rate and ETA", "[tools][progress]") {
  // 25 of 100: 24 * 25 / 100 = 6 of the bar's 24 cells; 2.5 items a second; 30 s left.
  CHECK(progress_line("conv", 25, 100, ProgressUnit::items, 10.0) ==
        "conv [######..................] 25/100  2.5/s  ETA 0:30");
  // Bytes: 1 GiB of 4 GiB in 8 s = 128 MiB/s, 24 s left.
  const std::uint64_t gib = 1ull << 30;
  CHECK(progress_line("store", gib, 4 * gib, ProgressUnit::bytes, 8.0, "layer 3") ==
        "store [######..................] 1.00 GiB/4.00 GiB  128 MiB/s  ETA 0:24  layer 3");
  // Done: no ETA; unknown total: no bar.
  CHECK(progress_line("x", 4, 4, ProgressUnit::items, 2.0) ==
        "x [########################] 4/4  2.0/s");
  CHECK(progress_line("x", 40, 0, ProgressUnit::items, 2.0) == "x 40  20/s");
  CHECK(progress_line(std::string(200, 'a'), 1, 2, ProgressUnit::items, 1.0).size() == 100);
}

TEST_CASE("progress: silent when the stream is not a terminal, or when quiet",
          "[tools][progress]") {
  std::FILE* f = std::tmpfile();
  REQUIRE(f != nullptr);
  {
    Progress p("work", 10, ProgressUnit::items, false, f);
    CHECK_FALSE(p.enabled());
    for (int i = 0; i <= 10; ++i) p.update(static_cast<std::uint64_t>(i), "step");
  }
  CHECK(std::ftell(f) == 0);
  std::fclose(f);
}

TEST_CASE("progress: drawn in place on a terminal, redraws rate-limited, the last one kept",
          "[tools][progress]") {
  const int master = ::posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || ::grantpt(master) != 0 || ::unlockpt(master) != 0) {
    WARN("no pseudo-terminal here: the terminal path is not tested");
    if (master >= 0) ::close(master);
    return;
  }
  std::FILE* tty = std::fopen(::ptsname(master), "w");
  REQUIRE(tty != nullptr);
  {
    Progress quiet("work", 3, ProgressUnit::items, true, tty);
    CHECK_FALSE(quiet.enabled());  // --json
    Progress p("work", 3, ProgressUnit::items, false, tty);
    CHECK(p.enabled());
    p.update(1);  // drawn (the first)
    p.update(2);  // within the redraw interval: skipped
    p.update(3);  // the last: always drawn
  }               // finish: a newline
  std::fclose(tty);
  std::string got;
  char buf[512];
  ::fcntl(master, F_SETFL, O_NONBLOCK);
  for (ssize_t n; (n = ::read(master, buf, sizeof buf)) > 0;) got.append(buf, std::size_t(n));
  ::close(master);
  CHECK(got.find("\rwork [########................] 1/3") != std::string::npos);
  CHECK(got.find("2/3") == std::string::npos);
  CHECK(got.find("\rwork [########################] 3/3") != std::string::npos);
  CHECK(got.find("\x1b[K") != std::string::npos);
  CHECK(got.back() == '\n');
}
