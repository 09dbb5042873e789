/* ple_storage over a .ple file written raw into a flash partition of a bare-metal board (mcu/README.md). */
#ifndef PLE_STORAGE_FLASH_H
#define PLE_STORAGE_FLASH_H

#include "ple.h"

typedef struct {
    const uint8_t *base;     /* the partition's first byte */
    uint64_t partition;      /* the partition's bytes (the file plus erased flash after it) */
    uint64_t reads, bytes;   /* read calls served and bytes copied */
    uint64_t refused;        /* reads asked past the file's end (answered -1, nothing copied) */
} ple_flash;

/* Open the partition: the file ends where its header says (bytes 16..23), bounded by the partition, as
 * esp-idf/ple_storage_esp.c does. Rows are copied out (read), never mapped: map always returns NULL. */
void ple_storage_flash(ple_storage *s, ple_flash *f, const uint8_t *base, uint64_t partition);

#endif
