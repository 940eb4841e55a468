// HMAC-SHA256 (FIPS 180-4, RFC 2104) for the connection handshake: small,
// dependency-free, and checked against Python's hmac in the tests.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace hoplite {

using Digest = std::array<uint8_t, 32>;

Digest sha256(const std::string& data);
Digest hmacSha256(const std::string& key, const std::string& message);
// The handshakes' proofs: `role`, the cluster id and both nonces (client's or
// dialer's first), then `tail`, under the cluster secret.
Digest clusterProof(const std::string& secret, const char* role, const std::string& clusterId,
                    const std::string& firstNonce, const std::string& secondNonce, const std::string& tail);
// Compares in time independent of where the inputs differ.
bool equalDigests(const Digest& a, const std::string& b);
// `n` bytes from the operating system's random source.
std::string randomBytes(size_t n);

}  // namespace hoplite
