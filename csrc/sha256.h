/* SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for hashing key parts. */
#ifndef MODERATO_SHA256_H
#define MODERATO_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_DIGEST_BYTES 32
#define SHA256_BLOCK_BYTES 64

typedef struct {
    uint32_t state[8];
    uint64_t message_bytes;                 /* hashed so far */
    unsigned char block[SHA256_BLOCK_BYTES];
    size_t block_bytes;                     /* buffered in block */
} sha256_context;

void sha256_init(sha256_context *context);
void sha256_update(sha256_context *context, const unsigned char *data, size_t size);
void sha256_final(sha256_context *context, unsigned char digest[SHA256_DIGEST_BYTES]);

void sha256(const unsigned char *data, size_t size, unsigned char digest[SHA256_DIGEST_BYTES]);
void hmac_sha256(const unsigned char *key, size_t key_size, const unsigned char *data,
                 size_t size, unsigned char digest[SHA256_DIGEST_BYTES]);

#endif /* MODERATO_SHA256_H */
