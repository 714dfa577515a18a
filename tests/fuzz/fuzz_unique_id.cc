// The unique id: 128 bytes that reach braidCommInitRank from the caller,
// usually after crossing a network (an MPI broadcast, a file, a key-value
// store). decode() must refuse whatever braidGetUniqueId did not make; the
// public call must then fail with braidInvalidArgument and say why, without
// a crash or a connection attempt.
//
// Input: the id's 128 bytes (shorter inputs are padded with zeros), then
// one optional byte choosing nranks and rank.
#include <cstdint>
#include <cstring>

#include "braid.h"
#include "src/bootstrap.h"
#include "tests/fuzz/fuzz_common.h"

using braid::fuzz::checkResult;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  braid::fuzz::clearLaunchEnvironment();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  braidUniqueId id{};
  static_assert(sizeof(id.internal) == braid::kUniqueIdBytes);
  std::memcpy(id.internal, data, std::min(size, braid::kUniqueIdBytes));

  auto info = braid::RendezvousInfo::decode(id.internal);
  checkResult(info);
  if (info.isOk()) {
    // What decoded encodes to an id that decodes alike.
    char again[braid::kUniqueIdBytes];
    info->encode(again);
    auto twice = braid::RendezvousInfo::decode(again);
    FUZZ_CHECK(twice.isOk());
    FUZZ_CHECK(twice->root.toString() == info->root.toString());
    FUZZ_CHECK(twice->secret == info->secret);
    // A well-formed id names a rendezvous: braidCommInitRank would dial it.
    return 0;
  }

  const int choice = size > braid::kUniqueIdBytes ? data[braid::kUniqueIdBytes] : 0;
  const int nranks = 1 + choice % 8;
  const int rank = (choice / 8) % nranks;
  braidComm_t comm = reinterpret_cast<braidComm_t>(&id);  // must be reset to NULL
  FUZZ_CHECK(braidCommInitRank(&comm, nranks, id, rank) == braidInvalidArgument);
  FUZZ_CHECK(comm == nullptr);
  const char* why = braidGetLastError(nullptr);
  FUZZ_CHECK(why != nullptr && std::strstr(why, "uniqueId") != nullptr);
  return 0;
}
