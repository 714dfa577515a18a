// The declared buffers (transports/memory_registry.h) and the RDMA
// registrations made of them (transports/ib/registration_cache.h).
#include "transports/memory_registry.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "transports/ib/model_verbs.h"
#include "transports/ib/registration_cache.h"

namespace braid::transport {
namespace {

TEST(MemoryRegistry, FindsTheRangeThatHoldsAWholeSpan) {
  MemoryRegistry registry;
  std::vector<uint8_t> buffer(4096);
  auto id = registry.add(buffer.data(), buffer.size());
  ASSERT_TRUE(id.isOk()) << id.status().message();
  auto whole = registry.find(buffer.data(), buffer.size());
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->id, *id);
  EXPECT_EQ(whole->base, reinterpret_cast<uintptr_t>(buffer.data()));
  EXPECT_TRUE(registry.find(buffer.data() + 100, 3996).has_value());
  EXPECT_FALSE(registry.find(buffer.data() + 100, 3997).has_value()) << "one byte past the end";
  EXPECT_FALSE(registry.find(buffer.data() - 1, 2).has_value()) << "one byte before";
  std::vector<uint8_t> other(64);
  EXPECT_FALSE(registry.find(other.data(), 1).has_value());
}

TEST(MemoryRegistry, RefusesWhatCannotBeABuffer) {
  MemoryRegistry registry;
  uint8_t byte = 0;
  EXPECT_EQ(registry.add(nullptr, 10).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(registry.add(&byte, 0).status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(registry.add(reinterpret_cast<void*>(UINTPTR_MAX - 10), 100).status().code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(registry.size(), 0u);
}

TEST(MemoryRegistry, RemovingIsOnceAndCountedAndIdsAreNeverShared) {
  MemoryRegistry a, b;
  std::vector<uint8_t> buffer(128);
  auto first = a.add(buffer.data(), buffer.size());
  auto second = b.add(buffer.data(), buffer.size());
  ASSERT_TRUE(first.isOk() && second.isOk());
  EXPECT_NE(*first, *second) << "another registry's handle must not name one of this one's";
  EXPECT_EQ(b.remove(*first).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(a.removals(), 0u);
  ASSERT_TRUE(a.remove(*first).isOk());
  EXPECT_EQ(a.removals(), 1u);
  EXPECT_FALSE(a.holds(*first));
  EXPECT_FALSE(a.find(buffer.data(), 1).has_value());
  const Status again = a.remove(*first);
  EXPECT_EQ(again.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(again.message().find("deregistered already"), std::string::npos) << again.message();
  auto third = a.add(buffer.data(), buffer.size());
  ASSERT_TRUE(third.isOk());
  EXPECT_NE(*third, *first) << "ids are not reused";
}

TEST(RegistrationCache, RegistersADeclaredRangeOnceUntilItIsRemoved) {
  auto device = ib::openModelDevice("model0");
  ASSERT_TRUE(device.isOk()) << device.status().message();
  auto pd = (*device)->allocProtectionDomain();
  ASSERT_TRUE(pd.isOk()) << pd.status().message();
  auto registry = std::make_shared<MemoryRegistry>();
  ib::RegistrationCache cache(**pd, registry);
  std::vector<uint8_t> buffer(1 << 16), undeclared(64);
  auto none = cache.find(undeclared.data(), undeclared.size());
  ASSERT_TRUE(none.isOk());
  EXPECT_EQ(*none, nullptr);
  auto id = registry->add(buffer.data(), buffer.size());
  ASSERT_TRUE(id.isOk());
  auto region = cache.find(buffer.data() + 4096, 100);
  ASSERT_TRUE(region.isOk()) << region.status().message();
  ASSERT_NE(*region, nullptr);
  EXPECT_EQ((*region)->addr(), buffer.data()) << "the whole declared range, not the span";
  EXPECT_EQ((*region)->length(), buffer.size());
  auto again = cache.find(buffer.data(), buffer.size());
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(*again, *region);
  EXPECT_EQ(cache.made(), 1u);
  EXPECT_EQ(cache.held(), 1u);
  ASSERT_TRUE(registry->remove(*id).isOk());
  auto gone = cache.find(buffer.data(), 100);
  ASSERT_TRUE(gone.isOk());
  EXPECT_EQ(*gone, nullptr);
  EXPECT_EQ(cache.held(), 0u) << "the registration is released with its declaration";
}

}  // namespace
}  // namespace braid::transport
