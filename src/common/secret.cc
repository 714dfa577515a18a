#include "src/common/secret.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <pthread.h>

namespace braid {

namespace {

// fork(2) copies only the calling thread, and with it every lock another
// thread held at that moment, locked for good: a child forked while a
// braid thread was inside libcrypto (a rendezvous server authenticating a
// joiner while a launcher forks its ranks) waited forever in its own first
// RAND_bytes or HMAC. So braid's threads enter libcrypto only while holding
// this lock shared, and fork takes it exclusively first (pthread_atfork),
// waiting for them to leave; both sides release it after.
class CryptoSection {
 public:
  static CryptoSection& get() {
    // Never destroyed: a detached thread may authenticate at exit.
    static CryptoSection* section = new CryptoSection;
    return *section;
  }

  // Held while the calling thread is inside libcrypto.
  class Inside {
   public:
    explicit Inside(pthread_rwlock_t* lock) : lock_(lock) { pthread_rwlock_rdlock(lock_); }
    ~Inside() { pthread_rwlock_unlock(lock_); }
    Inside(const Inside&) = delete;
    Inside& operator=(const Inside&) = delete;

   private:
    pthread_rwlock_t* lock_;
  };
  Inside enter() { return Inside(lock()); }

 private:
  CryptoSection() {
    makeLock();
    // The child takes a new lock rather than unlocking or re-initializing
    // its copy: the copy also counts the parent's threads that were waiting
    // for it, which the child has not, and names a writer by the parent's
    // thread id; and ThreadSanitizer, which keeps its own state per lock
    // address, would still see the copy write-locked after a re-init.
    (void)pthread_atfork([] { pthread_rwlock_wrlock(get().lock()); },
                         [] { pthread_rwlock_unlock(get().lock()); }, [] { get().makeLock(); });
  }
  // Writers first: a fork must not wait for a pause in a stream of
  // handshakes (with readers first, one waited seconds behind two threads
  // that authenticated without a break).
  void makeLock() {
    // The lock it replaces in a child is kept as it is, unused (one per
    // fork): it is held by a thread that no longer exists. Linked from the
    // new one, it is no leak to LeakSanitizer.
    locks_ = new Locks{{}, locks_};
    pthread_rwlockattr_t attributes;
    pthread_rwlockattr_init(&attributes);
    pthread_rwlockattr_setkind_np(&attributes, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(lock(), &attributes);
    pthread_rwlockattr_destroy(&attributes);
  }
  struct Locks {
    pthread_rwlock_t lock;
    Locks* replaced;
  };
  pthread_rwlock_t* lock() { return &locks_->lock; }
  Locks* locks_ = nullptr;
};

// Made as the library loads, before any of its threads exists: made on
// first use instead, a child forked while another thread was making it
// waited forever on the guard of its initialization.
[[maybe_unused]] const CryptoSection& kCryptoSection = CryptoSection::get();

}  // namespace

Status randomBytes(std::span<uint8_t> out) {
  auto inside = CryptoSection::get().enter();
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1)
    return systemError("RAND_bytes failed: no secure random source");
  return Status::ok();
}

Mac hmac(const Secret& secret, std::span<const uint8_t> data) {
  Mac mac{};
  unsigned int len = 0;
  auto inside = CryptoSection::get().enter();
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), data.data(), data.size(),
       mac.data(), &len);
  return mac;
}

bool macEqual(const Mac& a, const Mac& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool secretEqual(const Secret& a, const Secret& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Status beforeCryptoCleanup(void (*handler)()) {
  // Initialized first, so that the cleanup this hooks into is registered
  // with the process's exit already.
  auto inside = CryptoSection::get().enter();
  if (OPENSSL_init_crypto(0, nullptr) != 1 || OPENSSL_atexit(handler) != 1)
    return systemError("OpenSSL would not take a cleanup handler");
  return Status::ok();
}

std::string toHex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

bool fromHex(const std::string& text, std::span<uint8_t> out) {
  if (text.size() != 2 * out.size()) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = digit(text[2 * i]), lo = digit(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

}  // namespace braid
