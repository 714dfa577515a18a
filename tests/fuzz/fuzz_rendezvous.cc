// The rendezvous, as both ends read it from their socket: rank 0 reads a
// connecting rank's handshake and join request; a rank reads rank 0's
// handshake and answer (the address table, or a refusal). Also rank 0's
// admission of join requests. The bytes come through a BufferWire, as if a
// peer had sent them and closed; every read must end in a value or an error,
// never a crash, an overread or an allocation the input did not pay for.
//
// Input: one byte choosing what reads the rest.
//   0  rank 0 greets a connection: handshake, then join request
//   1  rank 0 reads a join request (what follows a good handshake)
//   2  a rank's handshake with rank 0 (the connecting side)
//   3  a rank reads rank 0's answer; the next byte is its nranks (1..64);
//      then each entry is read as init does: data address and topology
//   4  rank 0 admits join requests: pairs of little-endian int32 rank and
//      uint32 nranks, until the input ends or the roster is complete
#include <cstdint>
#include <cstring>
#include <set>

#include "src/agreed_settings.h"
#include "src/bootstrap.h"
#include "tests/fuzz/fuzz_common.h"

using braid::fuzz::checkResult;
using braid::fuzz::checkStatus;

namespace {

constexpr uint32_t kBootstrapPurpose = 1;
// An address, a newline and an encoded topology.
constexpr size_t kMaxPublishedBytes =
    256 + 1 + braid::kMaxAgreedSettingsBytes + 1 + braid::topo::kMaxEncodedBytes;

void admit(const uint8_t* data, size_t size) {
  braid::RendezvousRoster roster;
  std::set<int> expected;
  for (size_t at = 0; at + 8 <= size && !roster.complete(); at += 8) {
    int32_t rank;
    uint32_t nranks;
    std::memcpy(&rank, data + at, 4);
    std::memcpy(&nranks, data + at + 4, 4);
    const int before = roster.nranks();
    braid::Status s = roster.admit(rank, nranks);
    checkStatus(s);
    if (s.isOk()) {
      FUZZ_CHECK(rank >= 0 && rank < roster.nranks());
      FUZZ_CHECK(before < 0 || before == roster.nranks());
      FUZZ_CHECK(expected.insert(rank).second);
    } else {
      FUZZ_CHECK(s.code() == braid::ErrorCode::kInvalidArgument ||
                 s.code() == braid::ErrorCode::kInvalidUsage);
    }
    FUZZ_CHECK(roster.joined() == expected);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 5;
  ++data, --size;
  braid::Secret secret{};
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<uint8_t>(i);

  switch (mode) {
    case 0: {
      braid::tcp::BufferWire wire({data, size});
      auto request = braid::greetJoiner(wire, secret);
      checkResult(request);
      // Without this job's secret no input gets past the handshake.
      FUZZ_CHECK(!request.isOk());
      break;
    }
    case 1: {
      braid::tcp::BufferWire wire({data, size});
      auto request = braid::readJoinRequest(wire);
      checkResult(request);
      if (request.isOk()) FUZZ_CHECK(request->address.size() <= kMaxPublishedBytes);
      break;
    }
    case 2: {
      braid::tcp::BufferWire wire({data, size});
      braid::Status s = braid::tcp::handshakeConnect(wire, secret, kBootstrapPurpose, 3);
      checkStatus(s);
      FUZZ_CHECK(!s.isOk());
      break;
    }
    case 3: {
      if (size == 0) return 0;
      const int nranks = 1 + data[0] % 64;
      braid::tcp::BufferWire wire({data + 1, size - 1});
      auto table = braid::readRendezvousAnswer(wire, nranks);
      checkResult(table);
      if (!table.isOk()) break;
      FUZZ_CHECK(table->size() == static_cast<size_t>(nranks));
      // Then each entry as init reads it: address and topology, and the
      // address as the rank that dials it parses it.
      for (int p = 0; p < nranks; ++p) {
        const std::string& entry = (*table)[p];
        FUZZ_CHECK(entry.size() <= kMaxPublishedBytes);
        auto card = braid::decodePublished(entry, p);
        checkResult(card);
        if (card.isOk()) checkResult(braid::tcp::SocketAddress::parseNumeric(card->address));
      }
      break;
    }
    case 4:
      admit(data, size);
      break;
  }
  return 0;
}
