/* Flash-partition storage for the bare-metal harness: every access is a bounds-checked copy, as a SPI flash
 * read would be; nothing is mapped, so the runtime takes its copy-in paths (dense tensors into the arena
 * once, one record per token). The counters let the harness show reads per token and that nothing asked
 * for bytes past the file. */
#include "ple_storage_flash.h"

#include <string.h>

static int flash_read(ple_storage *s, uint64_t off, void *dst, size_t n) {
    ple_flash *f = s->ctx;
    if (off > s->size || n > s->size - off) {
        f->refused++;
        return -1;
    }
    memcpy(dst, f->base + off, n);
    f->reads++;
    f->bytes += n;
    return 0;
}

static const void *flash_map(ple_storage *s, uint64_t off, size_t n) {
    (void)s, (void)off, (void)n;
    return NULL;
}

static void flash_close(ple_storage *s) { s->ctx = NULL; }

void ple_storage_flash(ple_storage *s, ple_flash *f, const uint8_t *base, uint64_t partition) {
    memset(s, 0, sizeof *s);
    memset(f, 0, sizeof *f);
    f->base = base;
    f->partition = partition;
    uint64_t file_bytes = 0;
    if (partition >= 24) /* an erased partition (all 0xff) says 2^64 - 1: bounded below, refused by the magic */
        for (int i = 0; i < 8; i++) file_bytes |= (uint64_t)base[16 + i] << (8 * i);
    s->size = file_bytes < partition ? file_bytes : partition;
    s->ctx = f;
    s->read = flash_read;
    s->map = flash_map;
    s->close = flash_close;
}
