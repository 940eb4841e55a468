// Unit tests of the reduce planner (tree shapes, cost model, the frame rule it
// is told) and the CPU kernels (every op on exact values, NaN, wrap-around,
// rounding). Built with ASan + UBSan by tests/test_cpp_units.py.
#include <cmath>
#include <complex>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "coll/reduce_kernels.h"
#include "coll/reduce_plan.h"
#include "common/chunking.h"

#include "check.h"

using namespace hoplite;


// Every position but the root has one parent, children list their parent, the
// tree is connected, and no node has more than `degree` children.
static void checkTree(int count, int degree) {
  ReduceTree t = buildReduceTree(count, degree);
  CHECK(static_cast<int>(t.parent.size()) == count);
  CHECK(t.parent[t.root] == -1);
  int roots = 0;
  for (int p = 0; p < count; ++p) {
    if (t.parent[p] < 0) ++roots;
    CHECK(static_cast<int>(t.children[p].size()) <= degree);
    for (int c : t.children[p]) CHECK(t.parent[c] == p);
    int hops = 0;  // reaches the root without a cycle
    for (int q = p; q != t.root && hops <= count; q = t.parent[q]) ++hops;
    CHECK(hops <= t.depth);
  }
  CHECK(roots == 1);
}

static void testTrees() {
  for (int count = 1; count <= 40; ++count) {
    for (int degree = 1; degree <= 6; ++degree) checkTree(count, degree);
  }
  // Chain: each arrival feeds the next; the last is the root.
  ReduceTree chain = buildReduceTree(5, 1);
  CHECK(chain.root == 4 && chain.depth == 4);
  for (int p = 0; p < 4; ++p) CHECK(chain.parent[p] == p + 1);
  // Flat: the second arrival is the root, everyone else its child.
  ReduceTree flat = buildReduceTree(5, 4);
  CHECK(flat.root == 1 && flat.depth == 1);
  CHECK((flat.children[1] == std::vector<int>{0, 2, 3, 4}));
  // Binary, in order: the first three arrivals form a whole subtree.
  ReduceTree bin = buildReduceTree(7, 2);
  CHECK(bin.root == 3 && bin.depth == 2);
  CHECK(bin.parent[0] == 1 && bin.parent[2] == 1 && bin.parent[1] == 3);
  CHECK(bin.parent[4] == 5 && bin.parent[6] == 5 && bin.parent[5] == 3);
  // In order: every subtree is a contiguous run of arrivals, so the inputs
  // that come first form whole subtrees that reduce while others are missing.
  for (int count = 1; count <= 30; ++count) {
    for (int degree = 1; degree <= 5; ++degree) {
      ReduceTree t = buildReduceTree(count, degree);
      for (int p = 0; p < count; ++p) {
        std::set<int> members;
        std::vector<int> stack{p};
        while (!stack.empty()) {
          int q = stack.back();
          stack.pop_back();
          members.insert(q);
          for (int c : t.children[q]) stack.push_back(c);
        }
        CHECK(*members.rbegin() - *members.begin() + 1 == static_cast<int>(members.size()));
      }
    }
  }
  ReduceTree big = buildReduceTree(100000, 1);  // no deep recursion for chains
  CHECK(big.depth == 99999);
}

static void testCostModel() {
  LinkEstimate gbit{50e-6, 125e6};
  // Large objects: one inbound stream per node is what matters, so a chain.
  CHECK(chooseReduceDegree(8, 256u << 20, 4u << 20, gbit) == 1);
  // Tiny objects: latency dominates, so flat.
  CHECK(chooseReduceDegree(8, 64, 64, gbit) == 7);
  // In between, a high-latency link prefers a shallower tree than a fast one.
  LinkEstimate slow{5e-3, 125e6};
  CHECK(chooseReduceDegree(16, 4096, 4096, slow) > chooseReduceDegree(16, 4096, 4096, gbit));
  CHECK(chooseReduceDegree(1, 1u << 20, 1u << 20, gbit) == 1);
  CHECK(chooseReduceDegree(2, 1u << 20, 1u << 20, gbit) == 1);
  // T(d) for a chain: (k-1) hops of latency + chunk, plus one object time.
  double t = reduceTreeCost(4, 1, 1000000, 1000, LinkEstimate{1e-3, 1e6});
  CHECK(std::fabs(t - (3 * (1e-3 + 1e-3) + 1.0)) < 1e-9);
}

template <typename T>
static std::vector<T> run(ReduceOp op, const char* dtype, std::vector<T> a, const std::vector<T>& b) {
  ReduceKernel k;
  Status s = reduceKernel(op, dtype, &k);
  CHECK(s.ok());
  if (!s.ok()) return a;
  k.combine(a.data(), a.data(), b.data(), a.size());  // in place, as tasks do
  return a;
}

static uint16_t bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);  // exact for the values used here
}

static void testKernels() {
  // 37 elements: crosses vector widths and leaves a scalar tail.
  std::vector<float> a(37), b(37);
  for (int i = 0; i < 37; ++i) a[i] = static_cast<float>(i), b[i] = static_cast<float>(40 - 2 * i);
  auto sum = run(ReduceOp::kSum, "float32", a, b);
  auto prod = run(ReduceOp::kProd, "float32", a, b);
  auto mn = run(ReduceOp::kMin, "float32", a, b);
  auto mx = run(ReduceOp::kMax, "float32", a, b);
  for (int i = 0; i < 37; ++i) {
    CHECK(sum[i] == a[i] + b[i]);
    CHECK(prod[i] == a[i] * b[i]);
    CHECK(mn[i] == std::min(a[i], b[i]));
    CHECK(mx[i] == std::max(a[i], b[i]));
  }
  // NaN wins in MIN and MAX, as in torch.minimum.
  auto nanMin = run(ReduceOp::kMin, "float64", std::vector<double>{NAN, 1.0, 2.0}, std::vector<double>{0.0, NAN, 1.0});
  CHECK(std::isnan(nanMin[0]) && std::isnan(nanMin[1]) && nanMin[2] == 1.0);
  // Signed integers wrap around like torch, without undefined behaviour (UBSan is on).
  auto i8 = run(ReduceOp::kSum, "int8", std::vector<int8_t>{127, -128, 5}, std::vector<int8_t>{1, -1, -7});
  CHECK(i8[0] == -128 && i8[1] == 127 && i8[2] == -2);
  auto i64 = run(ReduceOp::kProd, "int64", std::vector<int64_t>{INT64_MAX, -3}, std::vector<int64_t>{2, 4});
  CHECK(i64[0] == -2 && i64[1] == -12);
  auto i16 = run(ReduceOp::kProd, "int16", std::vector<int16_t>{300, -2}, std::vector<int16_t>{300, 3});
  CHECK(i16[0] == static_cast<int16_t>(90000 - 65536 * 1) && i16[1] == -6);
  auto u8 = run(ReduceOp::kMax, "uint8", std::vector<uint8_t>{200, 3}, std::vector<uint8_t>{100, 4});
  CHECK(u8[0] == 200 && u8[1] == 4);
  // bool: SUM/MAX are or, PROD/MIN are and.
  bool x[4] = {false, false, true, true}, y[4] = {false, true, false, true};
  ReduceKernel k;
  CHECK(reduceKernel(ReduceOp::kSum, "bool", &k).ok());
  bool out[4];
  k.combine(out, x, y, 4);
  CHECK(!out[0] && out[1] && out[2] && out[3]);
  CHECK(reduceKernel(ReduceOp::kMin, "bool", &k).ok());
  k.combine(out, x, y, 4);
  CHECK(!out[0] && !out[1] && !out[2] && out[3]);
  // Bitwise ops on integers and bool.
  auto band = run(ReduceOp::kBand, "int8", std::vector<int8_t>{-1, 12}, std::vector<int8_t>{-128, 10});
  CHECK(band[0] == -128 && band[1] == 8);
  auto bxor = run(ReduceOp::kBxor, "uint64", std::vector<uint64_t>{~0ull, 6}, std::vector<uint64_t>{1, 3});
  CHECK(bxor[0] == ~1ull && bxor[1] == 5);
  CHECK(reduceKernel(ReduceOp::kBxor, "bool", &k).ok());
  k.combine(out, x, y, 4);
  CHECK(!out[0] && out[1] && out[2] && !out[3]);
  CHECK(!reduceKernel(ReduceOp::kBor, "float32", &k).ok());
  // Half and bfloat16 compute in float and round to nearest even.
  std::vector<uint16_t> h1{0x3c00, 0x4000}, h2{0x4000, 0x4000};  // 1+2, 2+2
  auto hs = run(ReduceOp::kSum, "float16", h1, h2);
  CHECK(hs[0] == 0x4200 && hs[1] == 0x4400);
  std::vector<uint16_t> b1{bf16(1.0f), bf16(256.0f)}, b2{bf16(2.0f), bf16(1.0f)};
  auto bs = run(ReduceOp::kSum, "bfloat16", b1, b2);
  CHECK(bs[0] == bf16(3.0f));
  CHECK(bs[1] == bf16(256.0f));  // 257 is not representable; ties to even gives 256
  // Half MIN/MAX order by value (negatives, NaN winning), picking stored bits.
  std::vector<uint16_t> ha{0xC000, 0x4200, 0x7E00, 0x3C00, 0x8000}, hb{0x3C00, 0xC400, 0x0000, 0x7E00, 0x0000};
  auto hmin = run(ReduceOp::kMin, "float16", ha, hb);
  CHECK((hmin == std::vector<uint16_t>{0xC000, 0xC400, 0x7E00, 0x7E00, 0x8000}));  // -0 == +0: the first, as torch
  auto hmax = run(ReduceOp::kMax, "float16", ha, hb);
  CHECK((hmax == std::vector<uint16_t>{0x3C00, 0x4200, 0x7E00, 0x7E00, 0x8000}));
  // AVG: SUM, then a division at the root.
  CHECK(reduceKernel(ReduceOp::kAvg, "float32", &k).ok() && k.divide != nullptr);
  std::vector<float> avg{3.0f, 9.0f};
  k.divide(avg.data(), 2, 3);
  CHECK(avg[0] == 1.0f && avg[1] == 3.0f);
  auto c = run(ReduceOp::kProd, "complex64", std::vector<std::complex<float>>{{1, 2}},
               std::vector<std::complex<float>>{{3, -1}});
  CHECK(c[0] == std::complex<float>(5, 5));
  // Refused pairs say why.
  CHECK(!reduceKernel(ReduceOp::kAvg, "int32", &k).ok());
  CHECK(!reduceKernel(ReduceOp::kMin, "complex128", &k).ok());
  Status s = reduceKernel(ReduceOp::kSum, "float8_e4m3fn", &k);
  CHECK(!s.ok() && s.message.find("float8_e4m3fn") != std::string::npos);
  CHECK(!reduceKernel(static_cast<ReduceOp>(9), "float32", &k).ok());
}

static float halfToFloat(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

static uint16_t floatToHalf(float x) {
  _Float16 h = static_cast<_Float16>(x);  // round to nearest even
  uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

// float16 SUM, PROD and AVG over many values, so that the AVX2 build's
// eight-at-a-time blocks and its scalar tail both run: every result must be
// the float computation rounded to nearest even, bit for bit (NaN as NaN).
static void testHalfBlocks() {
  const size_t n = 4099;  // 512 blocks of eight and a tail of three
  std::vector<uint16_t> a(n), b(n);
  uint32_t state = 12345;
  auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<uint16_t>(next() >> 16);
    b[i] = static_cast<uint16_t>(next() >> 16);
  }
  a[0] = 0x3c00, b[0] = 0x1400;  // 1 + 2^-10 (one ulp of 1): exact
  a[1] = 0x3c00, b[1] = 0x1000;  // 1 + 2^-11: a tie, to even (1)
  a[2] = 0x3c01, b[2] = 0x1000;  // (1 + 2^-10) + 2^-11: a tie, to even (1 + 2^-9)
  a[3] = 0x7bff, b[3] = 0x7bff;  // 65504 + 65504 overflows to inf
  auto isNan = [](uint16_t h) { return (h & 0x7fff) > 0x7c00; };
  auto same = [&](uint16_t got, float want) {
    const uint16_t w = floatToHalf(want);
    return isNan(w) ? isNan(got) : got == w;
  };
  auto sum = run(ReduceOp::kSum, "float16", a, b);
  auto prod = run(ReduceOp::kProd, "float16", a, b);
  bool sums = true, prods = true;
  for (size_t i = 0; i < n; ++i) {
    sums = sums && same(sum[i], halfToFloat(a[i]) + halfToFloat(b[i]));
    prods = prods && same(prod[i], halfToFloat(a[i]) * halfToFloat(b[i]));
  }
  CHECK(sums);
  CHECK(prods);
  CHECK(sum[0] == 0x3c01 && sum[1] == 0x3c00 && sum[2] == 0x3c02 && sum[3] == 0x7c00);
  ReduceKernel k;
  CHECK(reduceKernel(ReduceOp::kAvg, "float16", &k).ok() && k.divide != nullptr);
  std::vector<uint16_t> avg = a;
  k.divide(avg.data(), n, 3);
  bool divided = true;
  for (size_t i = 0; i < n; ++i) divided = divided && same(avg[i], halfToFloat(a[i]) / 3.0f);
  CHECK(divided);
}

// About 1/128 of an object within 128 KiB..4 MiB, at least 16 frames down to 64 KiB.
static void testChunkRule() {
  constexpr uint64_t KiB = 1024, MiB = 1024 * KiB;
  CHECK(chunkSize(1 * KiB, 0) == 64 * KiB);
  CHECK(chunkSize(1 * MiB, 0) == 64 * KiB);
  CHECK(chunkSize(2 * MiB, 0) == 128 * KiB);
  CHECK(chunkSize(4 * MiB, 0) == 128 * KiB);
  CHECK(chunkSize(16 * MiB, 0) == 128 * KiB);
  CHECK(chunkSize(32 * MiB, 0) == 256 * KiB);
  CHECK(chunkSize(64 * MiB, 0) == 512 * KiB);
  CHECK(chunkSize(256 * MiB, 0) == 2 * MiB);
  CHECK(chunkSize(512 * MiB, 0) == 4 * MiB);
  CHECK(chunkSize(4096 * MiB, 0) == 4 * MiB);
  CHECK(chunkSize(16 * MiB, 4 * KiB) == 4 * KiB);  // configured: as given
}

int main() {
  testChunkRule();
  testTrees();
  testCostModel();
  testKernels();
  testHalfBlocks();
  return finish("reduce");
}
