/* Storage back ends: a memory buffer (portable), and on POSIX hosts a file read with pread (nothing mapped,
 * so nothing stays resident) or the whole file mapped read-only. ESP-IDF: esp-idf/ple_storage_esp.c; bare
 * metal (PLE_BARE_METAL, no file system): mcu/ple_storage_flash.c. */
#include "ple.h"

#include <stdio.h>
#include <string.h>

static int mem_read(ple_storage *s, uint64_t off, void *dst, size_t n) {
    if (off > s->size || n > s->size - off) return -1;
    memcpy(dst, (const uint8_t *)s->ctx + off, n);
    return 0;
}

static const void *mem_map(ple_storage *s, uint64_t off, size_t n) {
    return off <= s->size && n <= s->size - off ? (const uint8_t *)s->ctx + off : NULL;
}

static void mem_close(ple_storage *s) { s->ctx = NULL; }

void ple_storage_mem(ple_storage *s, const void *buf, size_t n) {
    memset(s, 0, sizeof *s);
    s->read = mem_read;
    s->map = mem_map;
    s->close = mem_close;
    s->size = n;
    s->ctx = (void *)buf;
}

#if !defined(ESP_PLATFORM) && !defined(PLE_BARE_METAL)
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int file_read(ple_storage *s, uint64_t off, void *dst, size_t n) {
    uint8_t *p = dst;
    while (n) {
        ssize_t k = pread((int)s->handle, p, n, (off_t)off);
        if (k <= 0) {
            if (k < 0 && errno == EINTR) continue;
            return -1;
        }
        p += k;
        off += (uint64_t)k;
        n -= (size_t)k;
    }
    return 0;
}

static const void *no_map(ple_storage *s, uint64_t off, size_t n) {
    (void)s, (void)off, (void)n;
    return NULL;
}

static void file_close(ple_storage *s) {
    if (s->ctx) munmap(s->ctx, (size_t)s->size);
    if (s->handle >= 0) close((int)s->handle);
    s->ctx = NULL;
    s->handle = -1;
}

static int open_fd(ple_storage *s, const char *path, char *err) {
    memset(s, 0, sizeof *s);
    s->handle = -1;
    int fd = open(path, O_RDONLY);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb)) {
        snprintf(err, PLE_ERR, "%s: cannot open (%s)", path, strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        snprintf(err, PLE_ERR, "%s: not a regular file", path);
        close(fd);
        return -1;
    }
    s->handle = fd;
    s->size = (uint64_t)sb.st_size;
    s->close = file_close;
    s->read = file_read;
    s->map = no_map;
    return 0;
}

int ple_storage_file(ple_storage *s, const char *path, char *err) { return open_fd(s, path, err); }

int ple_storage_mmap(ple_storage *s, const char *path, char *err) {
    if (open_fd(s, path, err)) return -1;
    if (s->size == 0) return 0; /* nothing to map; the header check rejects it */
    void *p = mmap(NULL, (size_t)s->size, PROT_READ, MAP_PRIVATE, (int)s->handle, 0);
    if (p == MAP_FAILED) {
        snprintf(err, PLE_ERR, "%s: cannot map (%s)", path, strerror(errno));
        file_close(s);
        return -1;
    }
    madvise(p, (size_t)s->size, MADV_RANDOM); /* rows are random accesses: no readahead of neighbours */
    s->ctx = p;
    s->read = mem_read;
    s->map = mem_map;
    return 0;
}
#endif
