// Secrets and message authentication for the handshakes (OpenSSL libcrypto).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "src/common/status.h"

namespace braid {

using Secret = std::array<uint8_t, 16>;
using Mac = std::array<uint8_t, 32>;
using Nonce = std::array<uint8_t, 16>;

Status randomBytes(std::span<uint8_t> out);
// HMAC-SHA256(secret, data).
Mac hmac(const Secret& secret, std::span<const uint8_t> data);
// Constant-time comparison.
bool macEqual(const Mac& a, const Mac& b);
bool secretEqual(const Secret& a, const Secret& b);

// Runs `handler` when libcrypto cleans up (at the process's exit, or an
// explicit OPENSSL_cleanup), before it frees its locks: the moment after
// which no thread may authenticate anything. Handlers run newest first.
Status beforeCryptoCleanup(void (*handler)());

std::string toHex(std::span<const uint8_t> bytes);
// Exactly 2*out.size() hex digits, else false.
bool fromHex(const std::string& text, std::span<uint8_t> out);

}  // namespace braid
