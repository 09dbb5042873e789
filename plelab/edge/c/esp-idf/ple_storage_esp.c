/* ple_storage over an ESP-IDF flash partition (the .ple file flashed raw with `parttool.py` / esptool). */
#include "ple_esp.h"

#include <stdio.h>
#include <string.h>

#include "esp_partition.h"

typedef struct {
    const esp_partition_t *part;
    const void *base; /* mmap window over the whole file, or NULL */
    esp_partition_mmap_handle_t handle;
} esp_ctx;

static esp_ctx g_ctx; /* one model per device: no allocation needed for the context */

static int esp_read(ple_storage *s, uint64_t off, void *dst, size_t n) {
    esp_ctx *c = s->ctx;
    if (off > s->size || n > s->size - off) return -1;
    if (c->base) {
        memcpy(dst, (const uint8_t *)c->base + off, n);
        return 0;
    }
    return esp_partition_read(c->part, (size_t)off, dst, n) == ESP_OK ? 0 : -1;
}

static const void *esp_map(ple_storage *s, uint64_t off, size_t n) {
    esp_ctx *c = s->ctx;
    return c->base && off <= s->size && n <= s->size - off ? (const uint8_t *)c->base + off : NULL;
}

static void esp_close(ple_storage *s) {
    esp_ctx *c = s->ctx;
    if (c && c->base) esp_partition_munmap(c->handle);
    if (c) c->base = NULL;
}

int ple_storage_esp_partition(ple_storage *s, const char *label, char *err) {
    memset(s, 0, sizeof *s);
    const esp_partition_t *p = esp_partition_find_first(ESP_PARTITION_TYPE_DATA, ESP_PARTITION_SUBTYPE_ANY, label);
    if (!p) {
        snprintf(err, PLE_ERR, "no data partition labelled '%s' (see partitions.csv in the component README)", label);
        return -1;
    }
    uint8_t head[64];
    if (p->size < sizeof head || esp_partition_read(p, 0, head, sizeof head) != ESP_OK) {
        snprintf(err, PLE_ERR, "partition '%s' cannot be read", label);
        return -1;
    }
    /* the partition is larger than the file: the file ends where its header says (bytes 16..23) */
    uint64_t file_bytes = 0;
    for (int i = 0; i < 8; i++) file_bytes |= (uint64_t)head[16 + i] << (8 * i);
    g_ctx.part = p;
    g_ctx.base = NULL;
    s->ctx = &g_ctx;
    s->size = file_bytes < p->size ? file_bytes : p->size;
    s->read = esp_read;
    s->map = esp_map;
    s->close = esp_close;
    if (esp_partition_mmap(p, 0, (size_t)s->size, ESP_PARTITION_MMAP_DATA, &g_ctx.base, &g_ctx.handle) != ESP_OK)
        g_ctx.base = NULL; /* no MMU room: fall back to esp_partition_read per record */
    return 0;
}
