#include "src/common/secret.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

namespace braid {

Status randomBytes(std::span<uint8_t> out) {
  if (RAND_bytes(out.data(), static_cast<int>(out.size())) != 1)
    return systemError("RAND_bytes failed: no secure random source");
  return Status::ok();
}

Mac hmac(const Secret& secret, std::span<const uint8_t> data) {
  Mac mac{};
  unsigned int len = 0;
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
