#include <catch2/catch.hpp>

#include <vector>

#include "moekit/sched/ready_first.hpp"

using namespace moekit;

TEST_CASE("ReadyFirstScheduler reproduces Fate's Fig. 6 order", "[sched][fate]") {
  // Needed in request order 3, 1, 5, 2, 4. Resident: {2, 4}. Loading in transfer order [3, 1, 5].
  auto plan = [](std::uint32_t e, bool hit, bool in_flight, std::uint64_t ticket) {
    ExpertPlan p;
    p.key = {1, e};
    p.hit = hit;
    p.in_flight = in_flight;
    p.ticket = {ticket};
    p.n_tokens = 1;
    return p;
  };
  std::vector<ExpertPlan> plans{plan(3, true, true, 10), plan(1, true, true, 11),
                                plan(5, true, true, 12), plan(2, true, false, 0),
                                plan(4, true, false, 0)};
  ReadyFirstScheduler{}.schedule({}, plans);
  std::vector<std::uint32_t> order;
  for (const auto& p : plans) order.push_back(p.key.expert);
  CHECK(order == std::vector<std::uint32_t>{2, 4, 3, 1, 5});
}

TEST_CASE("ReadyFirstScheduler puts busy ready experts first and misses after in-flight ones",
          "[sched][fate]") {
  std::vector<ExpertPlan> plans(4);
  plans[0].key = {0, 0};
  plans[0].n_tokens = 9;  // miss
  plans[1].key = {0, 1};
  plans[1].hit = true;
  plans[1].n_tokens = 2;  // ready
  plans[2].key = {0, 2};
  plans[2].hit = true;
  plans[2].n_tokens = 7;  // ready, busier
  plans[3].key = {0, 3};
  plans[3].placement = Placement::skipped;
  ReadyFirstScheduler{}.schedule({}, plans);
  CHECK(plans[0].key.expert == 2);
  CHECK(plans[1].key.expert == 1);
  CHECK(plans[2].key.expert == 0);
  CHECK(plans[3].key.expert == 3);
}
