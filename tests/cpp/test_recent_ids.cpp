// RecentIds: a bounded memory of ids that forgets the oldest first, where
// remembering an id again makes it the newest.
#include <algorithm>
#include <string>
#include <vector>

#include "check.h"
#include "directory/recent_ids.h"

using namespace hoplite;

namespace {

std::vector<std::string> idsOf(const RecentIds<int>& ids) {
  std::vector<std::string> out;
  ids.forEach([&](std::string_view id, const int&) { out.emplace_back(id); });
  std::sort(out.begin(), out.end());
  return out;
}

// Longer than the string's inline buffer: the key's bytes come from the pool too.
std::string longId(int i) { return "a long object id, number " + std::to_string(i); }

void testForgetsTheOldestBeyondCapacity() {
  RecentIds<int> ids(3);
  for (int i = 0; i < 5; ++i) ids.remember(longId(i), i * 10);
  CHECK(ids.size() == 3);
  CHECK(ids.find(longId(0)) == nullptr);
  CHECK(ids.find(longId(1)) == nullptr);
  CHECK(ids.find(longId(2)) != nullptr && *ids.find(longId(2)) == 20);
  CHECK(ids.find(longId(4)) != nullptr && *ids.find(longId(4)) == 40);
}

void testRememberingAgainMakesTheNewest() {
  RecentIds<int> ids(3);
  ids.remember("a", 1);
  ids.remember("b", 2);
  ids.remember("c", 3);
  CHECK(ids.remember("a", 7) == 7);  // replaces, and "a" is now the newest
  ids.remember("d", 4);              // forgets "b", the oldest
  CHECK((idsOf(ids) == std::vector<std::string>{"a", "c", "d"}));
  CHECK(*ids.find("a") == 7);
}

void testForgetAndForgetIf() {
  RecentIds<int> ids(100);
  for (int i = 0; i < 10; ++i) ids.remember(longId(i), i);
  CHECK(ids.forget(longId(3)));
  CHECK(!ids.forget(longId(3)));
  ids.forgetIf([](std::string_view, const int& v) { return v % 2 == 0; });
  CHECK(ids.size() == 4);  // 1, 5, 7, 9
  CHECK(ids.contains(longId(5)) && !ids.contains(longId(4)));
  // What was forgotten leaves no trace in the order: 96 newer ids evict none of the four.
  for (int i = 100; i < 196; ++i) ids.remember(longId(i), i);
  CHECK(ids.size() == 100);
  CHECK(ids.contains(longId(1)) && ids.contains(longId(9)));
  ids.remember(longId(196), 196);
  CHECK(!ids.contains(longId(1)) && ids.contains(longId(5)));
  ids.clear();
  CHECK(ids.size() == 0 && idsOf(ids).empty());
  ids.remember("after clear", 1);
  CHECK(ids.size() == 1);
}

void testCapacityOfZeroKeepsTheNewest() {
  RecentIds<int> ids(0);
  ids.remember("x", 1);
  ids.remember("y", 2);
  CHECK((idsOf(ids) == std::vector<std::string>{"y"}));
}

void testManyCycles() {
  // Many times the capacity, as over a long run: the count stays at the bound
  // and the newest ids are the ones kept.
  RecentIds<int> ids(1000);
  for (int i = 0; i < 50000; ++i) ids.remember(longId(i), i);
  CHECK(ids.size() == 1000);
  CHECK(ids.contains(longId(49000)) && !ids.contains(longId(48999)));
}

}  // namespace

int main() {
  testForgetsTheOldestBeyondCapacity();
  testRememberingAgainMakesTheNewest();
  testForgetAndForgetIf();
  testCapacityOfZeroKeepsTheNewest();
  testManyCycles();
  return finish("test_recent_ids");
}
