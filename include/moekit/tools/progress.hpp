#pragma once
/// \file Progress of long work on a terminal: one line on stderr, redrawn in place (`\r`, at most
/// every `Progress::redraw_interval_s`), with what is done of the total (items or bytes), the rate
/// and the time left. Silent when asked (a tool's --json) and when its stream is not a terminal,
/// so logs and pipes stay clean. The text is built by pure functions (`progress_line`,
/// `eta_seconds`, `format_bytes`, `format_duration`) that the tests check.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include <unistd.h>

namespace moekit::tools {

/// What a progress line counts.
enum class ProgressUnit { items, bytes };

/// "512 B", "1.5 KiB", "3.25 GiB": three significant digits at most, binary units.
[[nodiscard]] inline std::string format_bytes(double bytes) {
  static constexpr const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else
    std::snprintf(buf, sizeof buf, "%.*f %s", bytes < 10 ? 2 : bytes < 100 ? 1 : 0, bytes, unit[u]);
  return buf;
}

/// "0:07", "12:30", "1:02:03" (rounded to the second).
[[nodiscard]] inline std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::llround(std::max(0.0, seconds)));
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

/// The time left when `done` of `total` took `elapsed_s`, at the same rate; none before any
/// work is done, when the total is unknown (0), or when no time has passed.
[[nodiscard]] inline std::optional<double> eta_seconds(std::uint64_t done, std::uint64_t total,
                                                       double elapsed_s) {
  if (done == 0 || total == 0 || !(elapsed_s > 0)) return std::nullopt;
  if (done >= total) return 0.0;
  return elapsed_s * double(total - done) / double(done);
}

/// One progress line: "LABEL [####......] DONE/TOTAL UNIT  RATE/s  ETA M:SS  DETAIL" (the bar,
/// total and time left only when the total is known), at most `max_chars` characters.
[[nodiscard]] inline std::string progress_line(std::string_view label, std::uint64_t done,
                                               std::uint64_t total, ProgressUnit unit,
                                               double elapsed_s, std::string_view detail = {},
                                               std::size_t max_chars = 100) {
  constexpr std::size_t bar_width = 24;
  auto amount = [unit](std::uint64_t v) {
    return unit == ProgressUnit::bytes ? format_bytes(double(v)) : std::to_string(v);
  };
  std::string s(label);
  if (total > 0) {
    const auto fill =
        static_cast<std::size_t>(double(bar_width) * double(std::min(done, total)) / double(total));
    s += " [" + std::string(fill, '#') + std::string(bar_width - fill, '.') + "] ";
    s += amount(done) + "/" + amount(total);
  } else {
    s += " " + amount(done);
  }
  if (elapsed_s > 0 && done > 0) {
    const double rate = double(done) / elapsed_s;
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", rate);
    s += "  " +
         (unit == ProgressUnit::items && rate < 10 ? std::string(buf)
                                                   : amount(std::uint64_t(rate))) +
         "/s";
  }
  if (const auto eta = eta_seconds(done, total, elapsed_s); eta && done < total)
    s += "  ETA " + format_duration(*eta);
  if (!detail.empty()) s += "  " + std::string(detail);
  if (s.size() > max_chars) s.resize(max_chars);
  return s;
}

/// A progress line on `out` (stderr by default): drawn only when `quiet` is false and `out` is a
/// terminal; `finish` (or the destructor) ends the line.
class Progress {
 public:
  /// Least seconds between two redraws (the last one is always drawn).
  static constexpr double redraw_interval_s = 0.2;

  Progress(std::string label, std::uint64_t total, ProgressUnit unit, bool quiet,
           std::FILE* out = stderr)
      : label_(std::move(label)),
        total_(total),
        unit_(unit),
        out_(out),
        enabled_(!quiet && out != nullptr && ::isatty(::fileno(out)) == 1),
        t0_(std::chrono::steady_clock::now()) {}
  ~Progress() { finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  /// Whether anything is drawn at all.
  [[nodiscard]] bool enabled() const noexcept { return enabled_; }
  /// The total, for work whose size is learnt after it started.
  void set_total(std::uint64_t total) noexcept { total_ = total; }

  /// `done` of the total so far, with an optional detail (what is being worked on).
  void update(std::uint64_t done, std::string_view detail = {}) {
    if (!enabled_) return;
    const double now =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const bool last = total_ > 0 && done >= total_;
    if (drawn_ && !last && now - last_draw_s_ < redraw_interval_s) return;
    last_draw_s_ = now;
    const std::string line = progress_line(label_, done, total_, unit_, now, detail);
    std::fprintf(out_, "\r%s\x1b[K", line.c_str());  // ESC[K: clear the rest of the old line
    std::fflush(out_);
    drawn_ = true;
  }

  /// Erases the line, so that other output can be printed; the next `update` draws it again.
  void clear() {
    if (drawn_) std::fputs("\r\x1b[K", out_), std::fflush(out_);
    drawn_ = false;
  }

  /// Ends the line (the next output starts on a new one).
  void finish() {
    if (drawn_) std::fputc('\n', out_), std::fflush(out_);
    drawn_ = false;
  }

 private:
  std::string label_;
  std::uint64_t total_;
  ProgressUnit unit_;
  std::FILE* out_;
  bool enabled_;
  bool drawn_ = false;
  double last_draw_s_ = 0;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace moekit::tools
