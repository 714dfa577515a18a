// DriverIpcDevice, the CUDA-IPC transport's device on a GPU, against the
// stand-in CUDA driver (tests/unit/fake_libcuda*.c, path in FAKE_LIBCUDA):
// GPU memory is host memory, a stream is a thread that runs its work in
// order, and handles opened in the process that exported them give the same
// memory and event back, so two devices in one process play two ranks.
// The stand-in counts open mappings and live events, so what a destructor
// fails to release shows; it refuses calls made without a context, so a
// call that does not make the device's context current fails.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "driver_ipc_device_fixture.h"

namespace braid::transport::cuda_ipc {
namespace {

using namespace driver_ipc_test;

TEST_F(DriverIpcDeviceTest, CreatesADeviceWithAStreamOfItsOwn) {
  auto first = makeDevice();
  auto second = makeDevice();
  ASSERT_TRUE(first && second);
  EXPECT_NE(first->stream(), nullptr);
  EXPECT_NE(first->stream(), second->stream());
  EXPECT_EQ(fake.contextDepth(), 0);
  ASSERT_OK(first->synchronize());

  auto noSuchGpu = DriverIpcDevice::create(1);
  ASSERT_FALSE(noSuchGpu.isOk());
  EXPECT_EQ(noSuchGpu.status().code(), ErrorCode::kUnhandledCudaError);
  EXPECT_NE(noSuchGpu.status().message().find("GPU 1: invalid argument (CUDA error 1)"),
            std::string::npos)
      << noSuchGpu.status().message();
}

// Whether processes on the GPU run at once (MPS) is asked once, at create;
// a driver that does not know the attribute leaves it unknown.
TEST_F(DriverIpcDeviceTest, SaysWhetherTheGpuIsSharedThroughMps) {
  auto unknown = makeDevice();
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->sharedThroughMps(), std::nullopt);
  setenv("FAKE_CUDA_MPS", "1", 1);
  auto shared = makeDevice();
  setenv("FAKE_CUDA_MPS", "0", 1);
  auto takingTurns = makeDevice();
  unsetenv("FAKE_CUDA_MPS");
  ASSERT_TRUE(shared && takingTurns);
  EXPECT_EQ(shared->sharedThroughMps(), std::optional<bool>(true));
  EXPECT_EQ(takingTurns->sharedThroughMps(), std::optional<bool>(false));
  EXPECT_EQ(shared->sharedThroughMps(), std::optional<bool>(true));  // asked once
}

TEST_F(DriverIpcDeviceTest, ExportedMemoryOpensFromItsHandleAndCopiesThroughItLand) {
  constexpr int kCount = 1024;
  auto device = makeDevice();
  ASSERT_TRUE(device);
  auto exported = take(device->allocate(kCount * sizeof(float)));
  auto source = take(device->allocate(kCount * sizeof(float)));
  ASSERT_TRUE(exported && source);
  EXPECT_NE(exported->handle().bytes, source->handle().bytes);

  const unsigned long opensBefore = fake.ipcOpenCount();
  const unsigned long mappingsBefore = fake.liveIpcMappings();
  auto opened = take(device->openMemory(exported->handle()));
  ASSERT_TRUE(opened);
  EXPECT_EQ(fake.ipcOpenCount(), opensBefore + 1);
  EXPECT_EQ(fake.liveIpcMappings(), mappingsBefore + 1);
  EXPECT_EQ(opened->handle().bytes, exported->handle().bytes);

  for (int i = 0; i < kCount; ++i) {
    floats(*source)[i] = 0.5f * static_cast<float>(i);
    floats(*exported)[i] = -1.0f;
  }
  ASSERT_OK(device->enqueueCopy(opened->data(), source->data(), kCount * sizeof(float)));
  ASSERT_OK(device->synchronize());
  for (int i = 0; i < kCount; ++i) ASSERT_EQ(floats(*exported)[i], 0.5f * static_cast<float>(i));

  opened.reset();
  EXPECT_EQ(fake.liveIpcMappings(), mappingsBefore);
}

// Two devices of one process stand for two ranks: the producer fills its
// memory with slow "GPU work" and records; the consumer waits for the
// record, then copies from the producer's memory. Without the wait the
// copy would run at once, on the consumer's own stream, and read zeros.
TEST_F(DriverIpcDeviceTest, AWaitHoldsLaterWorkUntilTheRecordedWorkRan) {
  constexpr int kCount = 512;
  constexpr size_t kBytes = kCount * sizeof(float);
  auto producer = makeDevice();
  auto consumer = makeDevice();
  ASSERT_TRUE(producer && consumer);
  auto produced = take(producer->allocate(kBytes));
  auto received = take(consumer->allocate(kBytes));
  ASSERT_TRUE(produced && received);
  std::memset(produced->data(), 0, kBytes);
  std::memset(received->data(), 0, kBytes);
  auto filled = take(producer->createEvent());
  ASSERT_TRUE(filled);
  auto peerFilled = take(consumer->openEvent(filled->handle()));
  auto peerProduced = take(consumer->openMemory(produced->handle()));
  ASSERT_TRUE(peerFilled && peerProduced);
  EXPECT_EQ(peerFilled->handle().bytes, filled->handle().bytes);

  SlowFill fill{floats(*produced), kCount, 3.0f};
  ASSERT_EQ(fake.launchKernel(producer->stream(), SlowFill::run, &fill), 0);
  ASSERT_OK(producer->enqueueRecord(*filled));
  ASSERT_OK(consumer->enqueueWait(*peerFilled));
  ASSERT_OK(consumer->enqueueCopy(received->data(), peerProduced->data(), kBytes));
  ASSERT_OK(consumer->synchronize());
  EXPECT_TRUE(fill.done.load());
  for (int i = 0; i < kCount; ++i)
    ASSERT_EQ(floats(*received)[i], 3.0f + static_cast<float>(i)) << "element " << i;
  ASSERT_OK(producer->synchronize());
}

// A wait for a record that the peer's GPU never runs (its process ended
// after it queued the record, before its GPU got there) fails synchronize
// after the limit, where cuStreamSynchronize waited for ever; what that
// GPU context may still use is then left unfreed.
TEST_F(DriverIpcDeviceTest, AWaitForARecordThatNeverRunsFailsSynchronizeInTime) {
  auto producer = makeDevice();
  auto consumer = makeDevice();
  ASSERT_TRUE(producer && consumer);
  consumer->setSynchronizeLimit(0.5);
  auto filled = take(producer->createEvent());
  ASSERT_TRUE(filled);
  auto peerFilled = take(consumer->openEvent(filled->handle()));
  ASSERT_TRUE(peerFilled);
  Gate gate;  // the producer's GPU, stopped short of the record
  ASSERT_EQ(fake.launchKernel(producer->stream(), Gate::run, &gate), 0);
  ASSERT_OK(producer->enqueueRecord(*filled));
  ASSERT_OK(consumer->enqueueWait(*peerFilled));
  const auto start = std::chrono::steady_clock::now();
  const Status waited = consumer->synchronize();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(waited.code(), ErrorCode::kTimeout) << waited.message();
  EXPECT_NE(waited.message().find("did not finish in 0.5 s"), std::string::npos)
      << waited.message();
  EXPECT_LT(seconds, 3.0);
  // From then on each wait looks once and does not wait the limit again:
  // destroying a communicator synchronizes each of its connections.
  const auto again = std::chrono::steady_clock::now();
  EXPECT_EQ(consumer->synchronize().code(), ErrorCode::kTimeout);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - again).count(), 0.4);
  gate.open.store(true);
  ASSERT_OK(producer->synchronize());
  ASSERT_OK(finishedWithin(*consumer, 2.0));  // the record ran after all
  peerFilled.reset();
  eventsLeftOnPurpose_ = 1;  // the consumer's opened event, never destroyed
}

// Pinned host memory (cuMemHostAlloc) takes copies both ways on the
// device's stream, and an event's query says whether the work before its
// record ran, never waiting: what gpu_staged builds on.
TEST_F(DriverIpcDeviceTest, PinnedHostMemoryTakesCopiesAndEventsTellWhenTheyRan) {
  constexpr int kCount = 512;
  constexpr size_t kBytes = kCount * sizeof(float);
  auto device = makeDevice();
  ASSERT_TRUE(device);
  auto gpu = take(device->allocate(kBytes));
  auto back = take(device->allocate(kBytes));
  auto pinned = take(device->allocateHost(kBytes));
  auto copied = take(device->createEvent());
  ASSERT_TRUE(gpu && back && pinned && copied);
  std::memset(pinned->data(), 0, kBytes);
  std::memset(back->data(), 0, kBytes);
  Gate gate;
  SlowFill fill{floats(*gpu), kCount, 5.0f};
  ASSERT_EQ(fake.launchKernel(device->stream(), Gate::run, &gate), 0);
  ASSERT_EQ(fake.launchKernel(device->stream(), SlowFill::run, &fill), 0);
  ASSERT_OK(device->enqueueCopy(pinned->data(), gpu->data(), kBytes));
  ASSERT_OK(device->enqueueRecord(*copied));
  auto before = device->hasRun(*copied);
  ASSERT_TRUE(before.isOk()) << before.status().message();
  EXPECT_FALSE(*before);  // held by the gate
  gate.open.store(true);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool ran = false;
  while (!ran && std::chrono::steady_clock::now() < until) ran = take(device->hasRun(*copied));
  ASSERT_TRUE(ran);
  for (int i = 0; i < kCount; ++i)
    ASSERT_EQ(static_cast<float*>(pinned->data())[i], 5.0f + static_cast<float>(i)) << i;
  ASSERT_OK(device->enqueueCopy(back->data(), pinned->data(), kBytes));
  ASSERT_OK(device->synchronize());
  EXPECT_EQ(std::memcmp(back->data(), pinned->data(), kBytes), 0);
}

// A wait is for the latest record queued before it: neither a record
// queued after it nor an event never recorded holds the waiting stream.
TEST_F(DriverIpcDeviceTest, AWaitIsForTheRecordsBeforeItOnly) {
  auto producer = makeDevice();
  auto consumer = makeDevice();
  ASSERT_TRUE(producer && consumer);
  auto event = take(producer->createEvent());
  ASSERT_TRUE(event);
  auto peerEvent = take(consumer->openEvent(event->handle()));
  ASSERT_TRUE(peerEvent);

  ASSERT_OK(consumer->enqueueWait(*peerEvent));
  ASSERT_OK(consumer->synchronize());

  ASSERT_OK(producer->enqueueRecord(*event));
  ASSERT_OK(producer->synchronize());
  ASSERT_OK(consumer->enqueueWait(*peerEvent));
  Gate gate;
  ASSERT_EQ(fake.launchKernel(producer->stream(), Gate::run, &gate), 0);
  ASSERT_OK(producer->enqueueRecord(*event));

  auto waited = std::async(std::launch::async, [&] { return consumer->synchronize(); });
  const bool passed = waited.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  gate.open.store(true);
  EXPECT_TRUE(passed) << "the consumer waited for a record queued after its wait";
  ASSERT_OK(waited.get());
  ASSERT_OK(producer->synchronize());
}

struct AddJob {
  float* dst;
  const float* local;
  const float* incoming;
  size_t units;
  static void run(void* self) {
    auto* job = static_cast<AddJob*>(self);
    for (size_t i = 0; i < job->units; ++i) job->dst[i] = job->local[i] + job->incoming[i];
    delete job;
  }
};

// What the test's device function saw when the device called it.
struct CombineCall {
  int calls = 0;
  void* stream = nullptr;
  size_t units = 0;
  int contextDepth = 0;
};

// The combiner's device function, as braid's kernels would be: queues the
// sum as "GPU work" on the stream it is given and returns at once.
Status addOnDevice(void* dst, const void* local, const void* incoming, size_t units,
                   const void* context, void* stream) {
  auto* seen = static_cast<CombineCall*>(const_cast<void*>(context));
  ++seen->calls;
  seen->stream = stream;
  seen->units = units;
  seen->contextDepth = fake.contextDepth();
  auto* job = new AddJob{static_cast<float*>(dst), static_cast<const float*>(local),
                         static_cast<const float*>(incoming), units};
  if (int r = fake.launchKernel(stream, AddJob::run, job); r != 0) {
    delete job;
    return Status(ErrorCode::kUnhandledCudaError, "launching the test's kernel");
  }
  return Status::ok();
}

void addOnHost(void*, const void*, const void*, size_t, const void*) {}

TEST_F(DriverIpcDeviceTest, CombineQueuesTheCombinersDeviceFunctionOnItsStream) {
  constexpr int kCount = 256;
  constexpr size_t kBytes = kCount * sizeof(float);
  auto device = makeDevice();
  ASSERT_TRUE(device);
  auto local = take(device->allocate(kBytes));
  auto incoming = take(device->allocate(kBytes));
  auto dst = take(device->allocate(kBytes));
  ASSERT_TRUE(local && incoming && dst);
  for (int i = 0; i < kCount; ++i) {
    floats(*local)[i] = static_cast<float>(i);
    floats(*incoming)[i] = 0.0f;
    floats(*dst)[i] = -1.0f;
  }

  CombineCall seen;
  Combiner combiner;
  combiner.unit = sizeof(float);
  combiner.apply = addOnHost;
  combiner.applyOnDevice = addOnDevice;
  combiner.context = &seen;
  // The sum must come after the slow fill of what it adds.
  SlowFill fill{floats(*incoming), kCount, 100.0f};
  ASSERT_EQ(fake.launchKernel(device->stream(), SlowFill::run, &fill), 0);
  ASSERT_OK(device->enqueueCombine(dst->data(), local->data(), incoming->data(), kBytes, combiner));
  EXPECT_EQ(seen.calls, 1);
  EXPECT_EQ(seen.stream, device->stream());
  EXPECT_EQ(seen.units, static_cast<size_t>(kCount));
  EXPECT_GT(seen.contextDepth, 0) << "the device function ran without the device's context";
  ASSERT_OK(device->synchronize());
  for (int i = 0; i < kCount; ++i)
    ASSERT_EQ(floats(*dst)[i], 100.0f + 2.0f * static_cast<float>(i)) << "element " << i;

  Status ragged =
      device->enqueueCombine(dst->data(), local->data(), incoming->data(), kBytes - 2, combiner);
  EXPECT_EQ(ragged.code(), ErrorCode::kInvalidArgument) << ragged.message();
  EXPECT_EQ(seen.calls, 1);
}

TEST_F(DriverIpcDeviceTest, CombineWithoutDeviceReductionsIsNotSupported) {
  auto device = makeDevice();
  ASSERT_TRUE(device);
  auto memory = take(device->allocate(64));
  ASSERT_TRUE(memory);
  Combiner combiner;
  combiner.unit = sizeof(float);
  combiner.apply = addOnHost;
  Status status =
      device->enqueueCombine(memory->data(), memory->data(), memory->data(), 64, combiner);
  EXPECT_EQ(status.code(), ErrorCode::kNotSupported);
  EXPECT_NE(status.message().find("not built"), std::string::npos) << status.message();
}

// Memory and events keep the GPU's context themselves, so they may go
// after the device that made them.
TEST_F(DriverIpcDeviceTest, DestructorsCloseMappingsAndDestroyEvents) {
  const unsigned long mappings = fake.liveIpcMappings();
  const unsigned long events = fake.liveEvents();
  auto device = makeDevice();
  ASSERT_TRUE(device);
  auto memory = take(device->allocate(4096));
  ASSERT_TRUE(memory);
  auto first = take(device->openMemory(memory->handle()));
  auto second = take(device->openMemory(memory->handle()));
  auto event = take(device->createEvent());
  ASSERT_TRUE(first && second && event);
  auto peerEvent = take(device->openEvent(event->handle()));
  ASSERT_TRUE(peerEvent);
  EXPECT_EQ(fake.liveIpcMappings(), mappings + 2);
  EXPECT_EQ(fake.liveEvents(), events + 2);
  ASSERT_OK(device->enqueueRecord(*event));
  ASSERT_OK(device->enqueueWait(*peerEvent));
  ASSERT_OK(device->synchronize());

  first.reset();
  EXPECT_EQ(fake.liveIpcMappings(), mappings + 1);
  event.reset();
  EXPECT_EQ(fake.liveEvents(), events + 1);
  device.reset();
  second.reset();
  peerEvent.reset();
  memory.reset();
  EXPECT_EQ(fake.liveIpcMappings(), mappings);
  EXPECT_EQ(fake.liveEvents(), events);
  EXPECT_EQ(fake.contextDepth(), 0);
}

// An event of another kind of device carries no CUevent.
class ForeignEvent final : public DeviceEvent {
 public:
  const IpcHandle& handle() const override { return handle_; }

 private:
  IpcHandle handle_;
};

TEST_F(DriverIpcDeviceTest, DriverErrorsComeBackWithCudasMessage) {
  auto device = makeDevice();
  ASSERT_TRUE(device);
  auto a = take(device->allocate(256));
  auto b = take(device->allocate(256));
  ASSERT_TRUE(a && b);

  fake.failCopies(1);
  Status copy = device->enqueueCopy(a->data(), b->data(), 256);
  fake.failCopies(0);
  EXPECT_EQ(copy.code(), ErrorCode::kUnhandledCudaError);
  EXPECT_EQ(copy.message(),
            "cuda_ipc: queueing a copy: an illegal memory access was encountered (CUDA error 700)");

  IpcHandle garbage;
  garbage.bytes.fill(0x5a);
  auto memory = device->openMemory(garbage);
  ASSERT_FALSE(memory.isOk());
  EXPECT_EQ(memory.status().code(), ErrorCode::kUnhandledCudaError);
  EXPECT_NE(memory.status().message().find("(CUDA error 400)"), std::string::npos)
      << memory.status().message();
  auto event = device->openEvent(garbage);
  ASSERT_FALSE(event.isOk());
  EXPECT_EQ(event.status().code(), ErrorCode::kUnhandledCudaError);

  ForeignEvent foreign;
  EXPECT_EQ(device->enqueueRecord(foreign).code(), ErrorCode::kInvalidUsage);
  EXPECT_EQ(device->enqueueWait(foreign).code(), ErrorCode::kInvalidUsage);

  // A faulted kernel's sticky error ends the stream for good.
  fake.failStream(device->stream());
  Status sync = device->synchronize();
  EXPECT_EQ(sync.code(), ErrorCode::kUnhandledCudaError);
  EXPECT_NE(sync.message().find("an illegal memory access was encountered (CUDA error 700)"),
            std::string::npos)
      << sync.message();
}

// The stand-in's allocator is not thread-safe (CUDA's is), so the memory
// is allocated first; the threads share the device for the rest.
TEST_F(DriverIpcDeviceTest, ThreadsShareADevice) {
  constexpr int kThreads = 4;
  constexpr int kCount = 1024;
  constexpr size_t kBytes = kCount * sizeof(float);
  auto device = makeDevice();
  ASSERT_TRUE(device);
  std::vector<std::unique_ptr<DeviceMemory>> from, to;
  for (int t = 0; t < kThreads; ++t) {
    from.push_back(take(device->allocate(kBytes)));
    to.push_back(take(device->allocate(kBytes)));
    ASSERT_TRUE(from.back() && to.back());
    for (int i = 0; i < kCount; ++i) floats(*from.back())[i] = static_cast<float>(t * kCount + i);
    std::memset(to.back()->data(), 0, kBytes);
  }
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      auto opened = device->openMemory(to[t]->handle());
      auto event = device->createEvent();
      if (!opened.isOk() || !event.isOk()) return;
      if (!device->enqueueCopy((*opened)->data(), from[t]->data(), kBytes).isOk() ||
          !device->enqueueRecord(**event).isOk() || !device->synchronize().isOk())
        return;
      if (std::memcmp(to[t]->data(), from[t]->data(), kBytes) == 0) ++good;
    });
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(good.load(), kThreads);
}

}  // namespace
}  // namespace braid::transport::cuda_ipc
