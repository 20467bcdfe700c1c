// SimLoader: link timing, on-demand before prefetch, cancellation, stall and late-byte accounting.
// Sizes are chosen so every time is a dyadic fraction and the sums are exact in double.

#include <catch2/catch.hpp>

#include "moekit/error.hpp"
#include "moekit/sim/sim_loader.hpp"
#include "moekit/sim/virtual_clock.hpp"

using namespace moekit;
using namespace moekit::sim;

namespace {

// 3 matrices of 32×32 f16 = 6144 bytes per expert; 2^30 B/s.
constexpr ModelShape tiny{.n_layers = 4, .n_experts = 4, .top_k = 1, .hidden = 32, .ffn = 32};
constexpr double bw = 1073741824.0;
const double dur = double(tiny.expert_bytes(Precision::f16)) / bw;

LoadRequest req(std::uint32_t layer, std::uint32_t e, LoadPriority p,
                Precision prec = Precision::f16) {
  return LoadRequest{ExpertKey{layer, e}, prec, p, {}};
}

}  // namespace

TEST_CASE("VirtualClock advances, counts stall, rejects bad durations", "[sim][clock]") {
  VirtualClock c;
  c.advance(0.25);
  CHECK(c.now() == 0.25);
  CHECK(c.stall_until(0.125) == 0.0);  // the past: no move
  CHECK(c.stall_until(1.0) == 0.75);
  CHECK(c.now() == 1.0);
  CHECK(c.stall() == 0.75);
  CHECK_THROWS_AS(c.advance(-1.0), Error);
}

TEST_CASE("SimLoader: one on-demand load takes bytes/bandwidth and wait stalls until then",
          "[sim][loader]") {
  REQUIRE(tiny.expert_bytes(Precision::f16) == 6144);
  SimLoader l(tiny, LinkModel{bw, 0.0});
  const LoadTicket t = l.submit(req(0, 0, LoadPriority::on_demand));
  CHECK_FALSE(l.poll(t));
  CHECK(l.completion_time(t) == dur);
  l.wait(t);
  CHECK(l.clock().now() == dur);
  CHECK(l.clock().stall() == dur);
  CHECK(l.poll(t));
  CHECK(l.stats().bytes == 6144);
  CHECK(l.stats().demand_bytes == 6144);
  CHECK(l.stats().late_waits == 0);
}

TEST_CASE("SimLoader: a load submitted later starts at its submit time; latency adds per load",
          "[sim][loader]") {
  const double lat = 1.0 / 1024;
  SimLoader l(tiny, LinkModel{bw, lat});
  l.clock().advance(2.0);
  const LoadTicket a = l.submit(req(0, 0, LoadPriority::on_demand));
  const LoadTicket b = l.submit(req(0, 1, LoadPriority::on_demand, Precision::q8));
  CHECK(l.completion_time(a) == 2.0 + lat + dur);
  l.wait(b);
  const double q8 = double(tiny.expert_bytes(Precision::q8)) / bw;
  CHECK(l.clock().now() == 2.0 + lat + dur + lat + q8);
  CHECK(l.clock().stall() == lat + dur + lat + q8);
  CHECK(l.stats().busy_s == lat + dur + lat + q8);
  // compute past both completions: poll sees them done without a wait
  l.clock().advance(1.0);
  CHECK(l.poll(a));
}

TEST_CASE("SimLoader: on-demand loads overtake queued prefetches, not the running one",
          "[sim][loader]") {
  SimLoader l(tiny, LinkModel{bw, 0.0});
  const LoadTicket p1 = l.submit(req(1, 0, LoadPriority::prefetch));  // starts at once
  const LoadTicket p2 = l.submit(req(1, 1, LoadPriority::prefetch));
  const LoadTicket p3 = l.submit(req(2, 0, LoadPriority::prefetch));
  const LoadTicket d = l.submit(req(0, 3, LoadPriority::on_demand));
  CHECK(l.queued() == 3);
  l.wait(d);
  CHECK(l.clock().now() == 2 * dur);  // behind p1 only
  CHECK(l.completion_time(p1) == dur);
  CHECK(l.completion_time(p2) == 3 * dur);  // p2 started when d finished
  l.wait(p3);
  CHECK(l.clock().now() == 4 * dur);
  CHECK(l.poll(p2));
  CHECK(l.stats().prefetch_bytes == 3 * 6144);
  CHECK(l.stats().demand_bytes == 6144);
}

TEST_CASE("SimLoader: cancelling a queued prefetch frees its place in the queue", "[sim][loader]") {
  SimLoader l(tiny, LinkModel{bw, 0.0});
  const LoadTicket p1 = l.submit(req(1, 0, LoadPriority::prefetch));
  const LoadTicket p2 = l.submit(req(1, 1, LoadPriority::prefetch));
  const LoadTicket p3 = l.submit(req(2, 0, LoadPriority::prefetch));
  const LoadTicket d = l.submit(req(0, 3, LoadPriority::on_demand));
  CHECK_FALSE(l.cancel(p1));  // running
  CHECK_FALSE(l.cancel(d));   // on-demand loads are never withdrawn
  CHECK(l.cancel(p2));
  CHECK_FALSE(l.cancel(p2));  // already withdrawn
  CHECK_FALSE(l.poll(p2));
  CHECK_THROWS_AS(l.wait(p2), Error);
  l.wait(p3);
  CHECK(l.clock().now() == 3 * dur);  // p1, d, p3: p2 moved no bytes
  CHECK(l.stats().bytes == 3 * 6144);
  CHECK(l.stats().cancelled == 1);
  CHECK(l.stats().cancelled_bytes == 6144);
  CHECK(l.queued() == 0);
}

TEST_CASE("SimLoader: a wait on an unfinished prefetch counts late bytes", "[sim][loader]") {
  SimLoader l(tiny, LinkModel{bw, 0.0});
  const LoadTicket p = l.submit(req(1, 0, LoadPriority::prefetch));
  const LoadTicket q = l.submit(req(1, 1, LoadPriority::prefetch));
  l.clock().advance(dur / 2);  // half of p overlapped with compute
  l.wait(p);
  CHECK(l.clock().now() == dur);
  CHECK(l.stats().late_waits == 1);
  CHECK(l.stats().late_bytes == 6144);
  CHECK(l.stats().late_stall_s == dur / 2);
  l.clock().advance(4 * dur);  // q done long ago: waiting on it is free and not late
  l.wait(q);
  CHECK(l.clock().now() == 5 * dur);
  CHECK(l.stats().late_waits == 1);
}

TEST_CASE("SimLoader: an idle gap leaves the link idle (no credit for past time)",
          "[sim][loader]") {
  SimLoader l(tiny, LinkModel{bw, 0.0});
  l.wait(l.submit(req(0, 0, LoadPriority::on_demand)));
  l.clock().advance(10.0);
  const LoadTicket t = l.submit(req(0, 1, LoadPriority::prefetch));
  CHECK(l.completion_time(t) == dur + 10.0 + dur);
}

TEST_CASE("SimLoader rejects bad links, keys and tickets", "[sim][loader]") {
  CHECK_THROWS_AS(SimLoader(tiny, LinkModel{0.0, 0.0}), Error);
  CHECK_THROWS_AS(SimLoader(tiny, LinkModel{1e9, -1.0}), Error);
  SimLoader l(tiny, LinkModel{bw, 0.0});
  CHECK_THROWS_AS(l.submit(req(9, 0, LoadPriority::on_demand)), Error);
  CHECK_THROWS_AS(l.submit(req(0, 0, LoadPriority::on_demand, Precision::skip)), Error);
  CHECK_THROWS_AS(l.wait(LoadTicket{42}), Error);
  CHECK_THROWS_AS(l.poll(LoadTicket{0}), Error);
  static_assert(!SimLoader::keeps_bytes);
}

// ---- reads_in_flight: R transfers share the link ------------------------------------------------

TEST_CASE("SimLoader: two equal reads started together with two readers both take twice one",
          "[sim][loader][reads_in_flight]") {
  SimLoader l(tiny, LinkModel{bw, 0.0, 2});
  const LoadTicket a = l.submit(req(0, 0, LoadPriority::on_demand));
  const LoadTicket b = l.submit(req(0, 1, LoadPriority::on_demand));
  CHECK(l.queued() == 0);  // both running
  CHECK(l.completion_time(a) == 2 * dur);
  CHECK(l.link_free_at() == 2 * dur);
  l.wait(a);
  CHECK(l.clock().now() == 2 * dur);
  CHECK(l.poll(b));  // finished together
  CHECK(l.stats().busy_s == 2 * dur);
  CHECK(l.stats().loads == 2);
}

TEST_CASE("SimLoader: a read joining a running one slows it; the survivor speeds up again",
          "[sim][loader][reads_in_flight]") {
  SimLoader l(tiny, LinkModel{bw, 0.0, 2});
  const LoadTicket a = l.submit(req(0, 0, LoadPriority::on_demand));
  l.clock().advance(dur / 2);  // a is half done
  const LoadTicket b = l.submit(req(0, 1, LoadPriority::on_demand));
  CHECK(l.completion_time(a) == dur / 2 + dur);  // its half at half the link
  l.wait(b);
  // b: half done when a ends at 1.5 dur, the other half alone: 2 dur in all
  CHECK(l.clock().now() == 2 * dur);
  CHECK(l.completion_time(a) == 1.5 * dur);
  CHECK(l.clock().stall() == 1.5 * dur);
}

TEST_CASE("SimLoader: with every reader busy, an on-demand load starts before a queued prefetch",
          "[sim][loader][reads_in_flight]") {
  SimLoader l(tiny, LinkModel{bw, 0.0, 2});
  const LoadTicket p1 = l.submit(req(1, 0, LoadPriority::prefetch));  // an upgrade, say
  l.clock().advance(dur / 2);
  const LoadTicket p2 = l.submit(req(1, 1, LoadPriority::prefetch));
  const LoadTicket p3 = l.submit(req(2, 0, LoadPriority::prefetch));
  const LoadTicket d = l.submit(req(0, 3, LoadPriority::on_demand));
  CHECK(l.queued() == 2);
  CHECK_FALSE(l.cancel(p1));  // running: never preempted
  l.wait(d);
  // p1 ends at 1.5 dur and its reader takes d, not the older p3; p2 ends at 2.5 dur, p3 starts
  // beside d, which ends at 3.5 dur; p3 then has half its work left, alone.
  CHECK(l.completion_time(p1) == 1.5 * dur);
  CHECK(l.completion_time(p2) == 2.5 * dur);
  CHECK(l.clock().now() == 3.5 * dur);
  CHECK(l.completion_time(p3) == 4 * dur);
  CHECK(l.link_free_at() == 4 * dur);
  l.wait(p3);
  CHECK(l.clock().now() == 4 * dur);
  CHECK(l.stats().busy_s == 4 * dur);
  CHECK(l.stats().late_waits == 1);
}

TEST_CASE("SimLoader: one reader is the serial link (a second read waits for the first)",
          "[sim][loader][reads_in_flight]") {
  // The same requests as the test above on reads_in_flight = 1: the former serial schedule.
  SimLoader l(tiny, LinkModel{bw, 0.0, 1});
  const LoadTicket a = l.submit(req(0, 0, LoadPriority::on_demand));
  const LoadTicket b = l.submit(req(0, 1, LoadPriority::on_demand));
  CHECK(l.completion_time(a) == dur);
  l.wait(b);
  CHECK(l.clock().now() == 2 * dur);
  CHECK(l.completion_time(a) == dur);
  CHECK(LinkModel{}.reads_in_flight == 1);  // the default
  CHECK_THROWS_AS(SimLoader(tiny, LinkModel{bw, 0.0, 0}), Error);
}

TEST_CASE("SimLoader: host reads go over the link only when switched on",
          "[sim][loader][host_reads]") {
  static_assert(declares<SimLoader>(Hook::prepare_host_bytes));
  SimLoader off(tiny, LinkModel{bw, 0.0});
  off.prepare_host_bytes({0, 1}, Precision::f16);
  CHECK_FALSE(off.host_read({0, 1}, Precision::f16).valid());
  CHECK(off.stats().loads == 0);

  SimLoader l(tiny, LinkModel{bw, 0.0, 2});
  l.set_host_reads(true);
  const LoadTicket p = l.submit(req(1, 0, LoadPriority::prefetch));
  l.prepare_host_bytes({0, 1}, Precision::f16);
  l.prepare_host_bytes({0, 1}, Precision::f16);  // pending already: one read
  const LoadTicket h = l.host_read({0, 1}, Precision::f16);
  REQUIRE(h.valid());
  CHECK_FALSE(l.host_read({0, 1}, Precision::q8).valid());
  l.wait(h);
  CHECK(l.clock().now() == 2 * dur);  // beside the prefetch
  CHECK(l.stats().host_reads == 1);
  CHECK(l.stats().demand_bytes == 6144);
  CHECK(l.poll(p));
  l.clear_host_reads();
  CHECK_FALSE(l.host_read({0, 1}, Precision::f16).valid());
}

TEST_CASE("SimLoader: one read alone gets at most read_bandwidth_bytes_per_s",
          "[sim][loader][reads_in_flight]") {
  // One read alone moves at half the link, two together fill it: both as slow as one alone.
  SimLoader l(tiny, LinkModel{bw, 0.0, 4, bw / 2});
  const LoadTicket a = l.submit(req(0, 0, LoadPriority::on_demand));
  CHECK(l.completion_time(a) == 2 * dur);
  CHECK(l.link_free_at() == 2 * dur);
  const LoadTicket b = l.submit(req(0, 1, LoadPriority::on_demand));
  CHECK(l.completion_time(b) == 2 * dur);
  l.clock().advance(dur);  // both half done; a third takes a third of the link each
  const LoadTicket c = l.submit(req(0, 2, LoadPriority::on_demand));
  CHECK(l.completion_time(a) == Approx(dur + 1.5 * dur).epsilon(1e-12));
  // a and b end at 2.5 dur with c half done; c alone at half the link: its half takes dur more
  CHECK(l.link_free_at() == Approx(3.5 * dur).epsilon(1e-12));
  l.wait(c);
  CHECK(l.clock().now() == Approx(3.5 * dur).epsilon(1e-12));
  CHECK(l.poll(a));
  CHECK(l.poll(b));
  CHECK_THROWS_AS(SimLoader(tiny, LinkModel{bw, 0.0, 2, 2 * bw}), Error);
}

TEST_CASE("SimLoader: a link far faster than one read does not inflate the read's latency",
          "[sim][loader][reads_in_flight]") {
  // moe-sim --bandwidth 100000GB/s over a calibrated one-read rate once gave 0.0086 tok/s: the
  // latency was divided by the tiny one-read share of the link.
  const double fast = 1e14, one_read = 2e9, latency = 1e-4;
  SimLoader l(tiny, LinkModel{fast, latency, 4, one_read});
  const LoadTicket a = l.submit(req(0, 0, LoadPriority::on_demand));
  const double bytes = double(tiny.expert_bytes(Precision::f16));
  CHECK(l.completion_time(a) == Approx(latency + bytes / one_read).epsilon(1e-9));
}

// ---- two read paths: experts in place beside an expert store ------------------------------------

namespace {
/// f16 in place at the whole disk's rate with 2 readers; the store (every other precision) one
/// reader at half of it.
LinkModel two_paths(double disk = 0.0) {
  LinkModel link{.bandwidth_bytes_per_s = bw, .latency_s = 0.0, .reads_in_flight = 2};
  link.store = ReadPath{.bandwidth_bytes_per_s = bw / 2, .latency_s = 0.0, .reads_in_flight = 1};
  link.in_place = Precision::f16;
  link.disk_bandwidth_bytes_per_s = disk;
  return link;
}
}  // namespace

TEST_CASE("SimLoader: a load takes the path of its precision, at that path's rate",
          "[sim][loader][paths]") {
  const double q8 = double(tiny.expert_bytes(Precision::q8)) / bw;
  SimLoader l(tiny, two_paths());
  const LoadTicket s = l.submit(req(0, 0, LoadPriority::on_demand, Precision::q8));
  CHECK(l.completion_time(s) == 2 * q8);  // the store alone: half the disk
  l.wait(s);
  const LoadTicket f = l.submit(req(0, 1, LoadPriority::on_demand));
  CHECK(l.completion_time(f) == 2 * q8 + dur);  // in place alone: the whole disk
  l.wait(f);
  CHECK(l.stats().busy_s == q8 + dur);  // the disk's work: its bytes at its whole rate
}

TEST_CASE("SimLoader: the two paths' readers are apart and share the disk, water-filled",
          "[sim][loader][paths]") {
  const double q8 = double(tiny.expert_bytes(Precision::q8)) / bw;
  SimLoader l(tiny, two_paths());
  // The store's one reader takes the first q8 load; the second waits for it, not for the
  // in-place readers, which are free.
  const LoadTicket s1 = l.submit(req(0, 0, LoadPriority::on_demand, Precision::q8));
  const LoadTicket s2 = l.submit(req(0, 1, LoadPriority::on_demand, Precision::q8));
  const LoadTicket f = l.submit(req(0, 2, LoadPriority::on_demand));
  CHECK(l.queued() == 1);
  // Running: s1 asks for half the disk, f for all of it; the disk gives each half.
  CHECK(l.completion_time(s1) == 2 * q8);
  CHECK(l.completion_time(f) == 2 * dur);
  l.wait(s2);
  // The store's loads run one after the other at half the disk (the in-place one beside them
  // never takes more than the disk leaves): 4 q8 in all.
  CHECK(l.clock().now() == Approx(4 * q8).epsilon(1e-12));
  CHECK(l.link_free_at() >= l.clock().now());
  l.wait(f);
  CHECK(l.poll(s1));
}

TEST_CASE("SimLoader: a disk cap below both paths slows each, the slower one keeping its rate",
          "[sim][loader][paths]") {
  // A disk of 3/4: the store asks 1/2 and the in-place read all of bw, both above the even level
  // of 3/8, so each gets 3/8.
  SimLoader l(tiny, two_paths(0.75 * bw));
  const LoadTicket s = l.submit(req(0, 0, LoadPriority::on_demand, Precision::q8));
  const LoadTicket f = l.submit(req(0, 1, LoadPriority::on_demand));
  const double q8b = double(tiny.expert_bytes(Precision::q8));
  CHECK(l.completion_time(s) == Approx(q8b / (0.375 * bw)).epsilon(1e-12));
  CHECK(l.completion_time(f) == Approx(6144.0 / (0.375 * bw)).epsilon(1e-12));
  // A disk that leaves the store its half: the in-place read gets the rest.
  SimLoader m(tiny, two_paths(1.25 * bw));
  const LoadTicket s2 = m.submit(req(0, 0, LoadPriority::on_demand, Precision::q8));
  const LoadTicket f2 = m.submit(req(0, 1, LoadPriority::on_demand));
  CHECK(m.completion_time(s2) == Approx(q8b / (0.5 * bw)).epsilon(1e-12));
  CHECK(m.completion_time(f2) == Approx(6144.0 / (0.75 * bw)).epsilon(1e-12));
}

TEST_CASE("SimLoader: the disk cap binds only while both paths read", "[sim][loader][paths]") {
  // The cap is both paths' rate together (moe-calibrate reads them at once): a path reading
  // alone keeps its own rate however far below it the cap lies.
  SimLoader l(tiny, two_paths(0.25 * bw));
  const LoadTicket f = l.submit(req(0, 1, LoadPriority::on_demand));
  CHECK(l.completion_time(f) == Approx(dur).epsilon(1e-12));
  l.wait(f);
  const double q8b = double(tiny.expert_bytes(Precision::q8));
  const LoadTicket s = l.submit(req(0, 0, LoadPriority::on_demand, Precision::q8));
  CHECK(l.completion_time(s) == Approx(dur + q8b / (0.5 * bw)).epsilon(1e-12));
  l.wait(s);
  // Together: 1/8 each until the first ends.
  const LoadTicket s2 = l.submit(req(0, 2, LoadPriority::on_demand, Precision::q8));
  const LoadTicket f2 = l.submit(req(0, 3, LoadPriority::on_demand));
  const double t0 = l.clock().now();
  CHECK(l.completion_time(s2) == Approx(t0 + q8b / (0.125 * bw)).epsilon(1e-12));
  CHECK(l.completion_time(f2) > t0 + dur);
}

TEST_CASE("SimLoader: a store needs the precision read in place", "[sim][loader][paths]") {
  LinkModel link = two_paths();
  link.in_place = Precision::skip;
  CHECK_THROWS_AS(SimLoader(tiny, link), Error);
  link = two_paths();
  link.store->reads_in_flight = 0;
  CHECK_THROWS_WITH(SimLoader(tiny, link), Catch::Contains("LinkModel.store.reads_in_flight"));
  CHECK(LinkModel{bw, 0.0}.path_of(Precision::q8) == 0);  // one path: every precision on it
  CHECK(two_paths().path_of(Precision::q8) == 1);
  CHECK(two_paths().path_of(Precision::f16) == 0);
}

TEST_CASE("LinkModel::set_bandwidth scales a store's path and the disk with the main one",
          "[sim][loader][paths]") {
  LinkModel one{.bandwidth_bytes_per_s = bw};
  one.set_bandwidth(2 * bw);
  CHECK(one.bandwidth_bytes_per_s == 2 * bw);
  CHECK_FALSE(one.store);
  LinkModel two = two_paths(1.25 * bw);
  two.store->read_bandwidth_bytes_per_s = bw / 4;
  two.set_bandwidth(bw / 2);
  CHECK(two.bandwidth_bytes_per_s == bw / 2);
  CHECK(two.store->bandwidth_bytes_per_s == bw / 4);
  CHECK(two.store->read_bandwidth_bytes_per_s == bw / 4);
  CHECK(two.disk_bandwidth_bytes_per_s == 0.625 * bw);
  two.set_bandwidth(bw / 4);  // the store's one-read rate above its new bandwidth: cut to it
  CHECK(two.store->read_bandwidth_bytes_per_s == bw / 8);
  CHECK_NOTHROW(two.validate());
}

TEST_CASE("SimLoader::compute: bytes read meanwhile delay the compute, bytes read in a stall not",
          "[sim][loader][compute_delay]") {
  const double B = double(tiny.expert_bytes(Precision::f16));
  LinkModel link{bw, 0.0};
  link.compute_s_per_byte = 0.25 / bw;  // at the full rate, a quarter of the compute's time
  SECTION("compute shorter than the read: a geometric series, dur/2 / (1 - 1/4)") {
    SimLoader l(tiny, link);
    (void)l.submit(req(0, 0, LoadPriority::on_demand));
    CHECK(l.compute(dur / 2) == Approx(dur / 2 / 0.75).epsilon(1e-6));
    CHECK(l.clock().now() == Approx(dur / 2 / 0.75).epsilon(1e-6));
    CHECK(l.clock().stall() == 0.0);
  }
  SECTION("compute longer than the read: the read's bytes once, B·compute_s_per_byte") {
    SimLoader l(tiny, link);
    (void)l.submit(req(0, 0, LoadPriority::on_demand));
    CHECK(l.compute(2 * dur) == Approx(2 * dur + B * link.compute_s_per_byte).epsilon(1e-9));
  }
  SECTION("a read waited for (a stall) delays no compute after it") {
    SimLoader l(tiny, link);
    const LoadTicket t = l.submit(req(0, 0, LoadPriority::on_demand));
    l.wait(t);
    CHECK(l.compute(dur) == dur);
    CHECK(l.clock().now() == 2 * dur);
  }
  SECTION("no read running: exactly the compute") {
    SimLoader l(tiny, link);
    CHECK(l.compute(dur) == dur);
  }
  SECTION("the latency's share of a transfer is no CPU work") {
    LinkModel slow = link;
    slow.latency_s = dur;  // the transfer's work: twice its bytes
    SimLoader l(tiny, slow);
    (void)l.submit(req(0, 0, LoadPriority::on_demand));
    CHECK(l.compute(4 * dur) == Approx(4 * dur + B * link.compute_s_per_byte).epsilon(1e-9));
  }
  SECTION("the store's path charges its own rate") {
    LinkModel two = link;
    two.compute_s_per_byte = 0;
    two.store = ReadPath{.bandwidth_bytes_per_s = bw, .compute_s_per_byte = 0.5 / bw};
    two.in_place = Precision::f16;
    SimLoader l(tiny, two);
    (void)l.submit(req(0, 0, LoadPriority::on_demand));                 // f16: in place, free
    (void)l.submit(req(0, 1, LoadPriority::on_demand, Precision::q8));  // the store's
    const double q8 = double(tiny.expert_bytes(Precision::q8));
    CHECK(l.compute(8 * dur) == Approx(8 * dur + q8 * 0.5 / bw).epsilon(1e-9));
  }
  SECTION("compute_s_per_byte 0: the clock moves exactly as advance moves it") {
    SimLoader a(tiny, LinkModel{bw, 0.0}), b(tiny, LinkModel{bw, 0.0});
    (void)a.submit(req(0, 0, LoadPriority::on_demand));
    (void)b.submit(req(0, 0, LoadPriority::on_demand));
    CHECK(a.compute(dur / 3) == dur / 3);
    b.clock().advance(dur / 3);
    CHECK(a.clock().now() == b.clock().now());
  }
  LinkModel bad = link;
  bad.compute_s_per_byte = -1e-12;
  CHECK_THROWS_WITH(SimLoader(tiny, bad), Catch::Contains("compute_s_per_byte"));
}
