// gpu_staged under orders no schedule planned: messages of random sizes in
// one or two channels, sends posted in tag order per channel (as the engine
// posts them) but channels and directions interleaved at random, receives
// posted shuffled or in reverse, with one to three bounce buffers each way,
// reserved ahead or not, and progress between posts or only at the end.
// Every message must arrive whole, without a hang: a receive that waits
// for a buffer must always have one coming back (staged_connection.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "fake_ipc_device.h"
#include "host_pair.h"
#include "transports/gpu_staged/staged_connection.h"

namespace braid::transport::gpu_staged {
namespace {

using cuda_ipc::DeviceBuffer;
using cuda_ipc::FakeIpcDevice;
using State = Request::State;

struct Message {
  Tag tag;
  size_t bytes = 0;
  std::unique_ptr<DeviceBuffer> source, destination;
  RequestPtr sent, received;
};

struct Round {
  int bounces = 1;
  bool reserve = false;
  int channels = 1;
  int perChannel = 1;
  int progressEvery = 0;  // posts between two progress calls; 0: only at the end
  bool receivesReversed = false;
};

class Orders {
 public:
  explicit Orders(std::mt19937& random) : random_(random) {}

  void run(const Round& round) {
    auto [hostA, hostB] = transport::testing::hostPair();
    ASSERT_TRUE(hostA && hostB);
    auto devA = std::make_shared<FakeIpcDevice>(), devB = std::make_shared<FakeIpcDevice>();
    devA->workDelay = std::chrono::microseconds(random_() % 200);
    devB->workDelay = std::chrono::microseconds(random_() % 200);
    StagedConnection::Options options;
    options.minBounceBytes = 4096;
    options.bouncesPerDirection = round.bounces;
    StagedConnection A(*hostA, devA, options), B(*hostB, devB, options);
    std::vector<Message> toB = messages(round, *devA, *devB), toA = messages(round, *devB, *devA);
    if (round.reserve) {
      ASSERT_TRUE(A.reserve(sizes(toB), sizes(toA)).isOk());
      ASSERT_TRUE(B.reserve(sizes(toA), sizes(toB)).isOk());
    }
    // Four queues of posts, each in its own order, taken from at random.
    struct Post {
      StagedConnection* on;
      Message* message;
      bool send;
    };
    std::vector<std::vector<Post>> queues(4);
    for (int i : sendOrder(round)) queues[0].push_back({&A, &toB[i], true});
    for (int i : sendOrder(round)) queues[1].push_back({&B, &toA[i], true});
    for (int i : receiveOrder(round, toB.size())) queues[2].push_back({&B, &toB[i], false});
    for (int i : receiveOrder(round, toA.size())) queues[3].push_back({&A, &toA[i], false});
    std::vector<size_t> next(4, 0);
    size_t left = 2 * (toA.size() + toB.size());  // a send and a receive each
    for (int posted = 1; left > 0;) {
      const size_t q = random_() % 4;
      if (next[q] == queues[q].size()) continue;
      const Post& p = queues[q][next[q]++];
      --left;
      Message& m = *p.message;
      if (p.send)
        m.sent = p.on->postSend(m.source->data(), m.bytes, m.tag);
      else
        m.received = p.on->postRecv(m.destination->data(), m.bytes, m.tag);
      if (round.progressEvery > 0 && posted++ % round.progressEvery == 0) {
        (void)A.progress();
        (void)B.progress();
      }
    }
    auto pending = [&] {
      for (const auto* all : {&toA, &toB})
        for (const Message& m : *all)
          if (m.sent->state() == State::kPending || m.received->state() == State::kPending)
            return true;
      return false;
    };
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (pending() && std::chrono::steady_clock::now() < until) {
      (void)A.progress();
      (void)B.progress();
    }
    ASSERT_FALSE(pending()) << "still pending after 10 s; bounce buffers: " << A.bounceBuffers()
                            << " and " << B.bounceBuffers();
    ASSERT_TRUE(devA->synchronize().isOk());
    ASSERT_TRUE(devB->synchronize().isOk());
    for (const auto* all : {&toA, &toB})
      for (const Message& m : *all) {
        ASSERT_EQ(m.sent->state(), State::kDone) << m.sent->error().message();
        ASSERT_EQ(m.received->state(), State::kDone) << m.received->error().message();
        ASSERT_EQ(std::memcmp(m.source->data(), m.destination->data(), m.bytes), 0)
            << "message " << m.tag.value;
      }
  }

 private:
  std::vector<Message> messages(const Round& round, FakeIpcDevice& from, FakeIpcDevice& to) {
    std::vector<Message> made;
    for (int c = 0; c < round.channels; ++c)
      for (int k = 0; k < round.perChannel; ++k) {
        Message m;
        m.tag = Tag{(uint64_t(c + 1) << 56) | uint64_t(100 + k), 7};
        const unsigned kind = random_() % 4;  // empty, within a buffer, or up to three
        m.bytes = kind == 0 ? 0 : kind == 1 ? 1 + random_() % 4096 : 1 + random_() % 12000;
        m.source = std::make_unique<DeviceBuffer>(from, m.bytes + 1);
        m.destination = std::make_unique<DeviceBuffer>(to, m.bytes + 1);
        for (size_t i = 0; i < m.bytes; ++i) m.source->data()[i] = static_cast<uint8_t>(random_());
        made.push_back(std::move(m));
      }
    return made;
  }
  static std::vector<size_t> sizes(const std::vector<Message>& all) {
    std::vector<size_t> out;
    for (const Message& m : all) out.push_back(m.bytes);
    return out;
  }
  // Tag order within each channel; the channels interleaved at random.
  std::vector<int> sendOrder(const Round& round) {
    std::vector<int> taken(round.channels, 0), order;
    while (static_cast<int>(order.size()) < round.channels * round.perChannel) {
      const int c = static_cast<int>(random_() % round.channels);
      if (taken[c] < round.perChannel) order.push_back(c * round.perChannel + taken[c]++);
    }
    return order;
  }
  std::vector<int> receiveOrder(const Round& round, size_t count) {
    std::vector<int> order(count);
    for (size_t i = 0; i < count; ++i) order[i] = static_cast<int>(i);
    if (round.receivesReversed)
      std::reverse(order.begin(), order.end());
    else
      std::shuffle(order.begin(), order.end(), random_);
    return order;
  }

  std::mt19937& random_;
};

TEST(StagedOrders, EveryMessageArrivesWholeInAnyOrderOfPosts) {
  std::mt19937 random(20261203);
  Orders orders(random);
  for (int i = 0; i < 200; ++i) {
    SCOPED_TRACE(::testing::Message() << "round " << i);
    Round round;
    round.bounces = 1 + static_cast<int>(random() % 3);
    round.reserve = random() % 2 == 0;
    round.channels = 1 + static_cast<int>(random() % 2);
    round.perChannel = 1 + static_cast<int>(random() % 10);
    round.progressEvery = static_cast<int>(random() % 4);
    round.receivesReversed = random() % 3 == 0;
    orders.run(round);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace braid::transport::gpu_staged
