/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104).
 *
 * Written for clarity over speed: it hashes key components of at most a
 * few hundred bytes, except for hostile input that is hashed once. */
#include <string.h>

#include "sha256.h"

/* First 32 bits of the fractional parts of the cube roots of the first 64
 * primes (FIPS 180-4, 4.2.2). */
static const uint32_t round_constants[64] = {
    0x428a2f98U, 0x71374491U, 0xb5c0fbcfU, 0xe9b5dba5U,
    0x3956c25bU, 0x59f111f1U, 0x923f82a4U, 0xab1c5ed5U,
    0xd807aa98U, 0x12835b01U, 0x243185beU, 0x550c7dc3U,
    0x72be5d74U, 0x80deb1feU, 0x9bdc06a7U, 0xc19bf174U,
    0xe49b69c1U, 0xefbe4786U, 0x0fc19dc6U, 0x240ca1ccU,
    0x2de92c6fU, 0x4a7484aaU, 0x5cb0a9dcU, 0x76f988daU,
    0x983e5152U, 0xa831c66dU, 0xb00327c8U, 0xbf597fc7U,
    0xc6e00bf3U, 0xd5a79147U, 0x06ca6351U, 0x14292967U,
    0x27b70a85U, 0x2e1b2138U, 0x4d2c6dfcU, 0x53380d13U,
    0x650a7354U, 0x766a0abbU, 0x81c2c92eU, 0x92722c85U,
    0xa2bfe8a1U, 0xa81a664bU, 0xc24b8b70U, 0xc76c51a3U,
    0xd192e819U, 0xd6990624U, 0xf40e3585U, 0x106aa070U,
    0x19a4c116U, 0x1e376c08U, 0x2748774cU, 0x34b0bcb5U,
    0x391c0cb3U, 0x4ed8aa4aU, 0x5b9cca4fU, 0x682e6ff3U,
    0x748f82eeU, 0x78a5636fU, 0x84c87814U, 0x8cc70208U,
    0x90befffaU, 0xa4506cebU, 0xbef9a3f7U, 0xc67178f2U,
};

/* First 32 bits of the fractional parts of the square roots of the first
 * 8 primes (FIPS 180-4, 5.3.3). */
static const uint32_t initial_state[8] = {
    0x6a09e667U, 0xbb67ae85U, 0x3c6ef372U, 0xa54ff53aU,
    0x510e527fU, 0x9b05688cU, 0x1f83d9abU, 0x5be0cd19U,
};

#define HMAC_INNER_PAD 0x36
#define HMAC_OUTER_PAD 0x5c

static uint32_t
rotate_right(uint32_t value, unsigned bits)
{
    return (value >> bits) | (value << (32 - bits));
}

static uint32_t
load_big_endian(const unsigned char *bytes)
{
    return ((uint32_t)bytes[0] << 24) | ((uint32_t)bytes[1] << 16) |
           ((uint32_t)bytes[2] << 8) | (uint32_t)bytes[3];
}

static void
store_big_endian(unsigned char *bytes, uint32_t value)
{
    bytes[0] = (unsigned char)(value >> 24);
    bytes[1] = (unsigned char)(value >> 16);
    bytes[2] = (unsigned char)(value >> 8);
    bytes[3] = (unsigned char)value;
}

static void
compress(uint32_t state[8], const unsigned char block[SHA256_BLOCK_BYTES])
{
    uint32_t schedule[64];
    for (int t = 0; t < 16; t++) {
        schedule[t] = load_big_endian(block + 4 * t);
    }
    for (int t = 16; t < 64; t++) {
        uint32_t w15 = schedule[t - 15], w2 = schedule[t - 2];
        uint32_t sigma0 = rotate_right(w15, 7) ^ rotate_right(w15, 18) ^ (w15 >> 3);
        uint32_t sigma1 = rotate_right(w2, 17) ^ rotate_right(w2, 19) ^ (w2 >> 10);
        schedule[t] = schedule[t - 16] + sigma0 + schedule[t - 7] + sigma1;
    }

    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int t = 0; t < 64; t++) {
        uint32_t sum1 = rotate_right(e, 6) ^ rotate_right(e, 11) ^ rotate_right(e, 25);
        uint32_t choice = (e & f) ^ (~e & g);
        uint32_t temp1 = h + sum1 + choice + round_constants[t] + schedule[t];
        uint32_t sum0 = rotate_right(a, 2) ^ rotate_right(a, 13) ^ rotate_right(a, 22);
        uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
        uint32_t temp2 = sum0 + majority;
        h = g;
        g = f;
        f = e;
        e = d + temp1;
        d = c;
        c = b;
        b = a;
        a = temp1 + temp2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
}

void
sha256_init(sha256_context *context)
{
    memcpy(context->state, initial_state, sizeof(initial_state));
    context->message_bytes = 0;
    context->block_bytes = 0;
}

void
sha256_update(sha256_context *context, const unsigned char *data, size_t size)
{
    context->message_bytes += size;
    if (context->block_bytes > 0) {
        size_t taken = SHA256_BLOCK_BYTES - context->block_bytes;
        if (taken > size) {
            taken = size;
        }
        memcpy(context->block + context->block_bytes, data, taken);
        context->block_bytes += taken;
        data += taken;
        size -= taken;
        if (context->block_bytes < SHA256_BLOCK_BYTES) {
            return;
        }
        compress(context->state, context->block);
        context->block_bytes = 0;
    }
    for (; size >= SHA256_BLOCK_BYTES; data += SHA256_BLOCK_BYTES, size -= SHA256_BLOCK_BYTES) {
        compress(context->state, data);
    }
    if (size > 0) {
        memcpy(context->block, data, size);
        context->block_bytes = size;
    }
}

void
sha256_final(sha256_context *context, unsigned char digest[SHA256_DIGEST_BYTES])
{
    /* Pad with 0x80, zeros, then the message length in bits as 64 bits. */
    uint64_t message_bits = context->message_bytes * 8;
    context->block[context->block_bytes++] = 0x80;
    if (context->block_bytes > SHA256_BLOCK_BYTES - 8) {
        memset(context->block + context->block_bytes, 0,
               SHA256_BLOCK_BYTES - context->block_bytes);
        compress(context->state, context->block);
        context->block_bytes = 0;
    }
    memset(context->block + context->block_bytes, 0,
           SHA256_BLOCK_BYTES - 8 - context->block_bytes);
    store_big_endian(context->block + SHA256_BLOCK_BYTES - 8, (uint32_t)(message_bits >> 32));
    store_big_endian(context->block + SHA256_BLOCK_BYTES - 4, (uint32_t)message_bits);
    compress(context->state, context->block);
    for (int i = 0; i < 8; i++) {
        store_big_endian(digest + 4 * i, context->state[i]);
    }
}

void
sha256(const unsigned char *data, size_t size, unsigned char digest[SHA256_DIGEST_BYTES])
{
    sha256_context context;
    sha256_init(&context);
    sha256_update(&context, data, size);
    sha256_final(&context, digest);
}

/* One of HMAC's two passes: SHA-256 over the block key XOR pad_byte, then data. */
static void
hmac_pass(const unsigned char block_key[SHA256_BLOCK_BYTES], unsigned char pad_byte,
          const unsigned char *data, size_t size, unsigned char digest[SHA256_DIGEST_BYTES])
{
    unsigned char pad[SHA256_BLOCK_BYTES];
    sha256_context context;
    for (int i = 0; i < SHA256_BLOCK_BYTES; i++) {
        pad[i] = block_key[i] ^ pad_byte;
    }
    sha256_init(&context);
    sha256_update(&context, pad, SHA256_BLOCK_BYTES);
    sha256_update(&context, data, size);
    sha256_final(&context, digest);
}

void
hmac_sha256(const unsigned char *key, size_t key_size, const unsigned char *data, size_t size,
            unsigned char digest[SHA256_DIGEST_BYTES])
{
    unsigned char block_key[SHA256_BLOCK_BYTES] = {0};
    unsigned char inner_digest[SHA256_DIGEST_BYTES];

    /* A key longer than a block is replaced by its hash; shorter ones are
     * padded with zeros. */
    if (key_size > SHA256_BLOCK_BYTES) {
        sha256(key, key_size, block_key);
    }
    else if (key_size > 0) {
        memcpy(block_key, key, key_size);
    }

    hmac_pass(block_key, HMAC_INNER_PAD, data, size, inner_digest);
    hmac_pass(block_key, HMAC_OUTER_PAD, inner_digest, SHA256_DIGEST_BYTES, digest);
}
