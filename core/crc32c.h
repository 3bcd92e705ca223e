/* crc32c.h - CRC-32C (Castagnoli), the checksum of checkpoint tensors.
 *
 * Chosen over SHA-256 because it needs no library (OpenSSL is not among
 * hpdl's dependencies) and runs at memory speed; it detects the faults a
 * checkpoint meets (truncation, torn writes, flipped bits), not tampering.
 * The polynomial is 0x1EDC6F41 (reflected 0x82F63B78), as in iSCSI (RFC
 * 3720) and ext4; check value crc32c("123456789") = 0xE3069283. */
#ifndef HPDL_CRC32C_H
#define HPDL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over len bytes; chunks may be fed in pieces. */
uint32_t crc32c_update(uint32_t crc, const void *data, size_t len);

/* A whole file's CRC and size (the artifact's file list: hpdlc compile
 * writes them, hpdlrun checks them). 0, or -1 with errno set. */
int crc32c_file(const char *path, int64_t *bytes, uint32_t *crc);

#endif
