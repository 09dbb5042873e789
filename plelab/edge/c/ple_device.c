/* Device profiles: the tiers of plelab/edge/devices.toml (built in, generated into devices.inc) or a profile
 * file in the same line format:
 *     device NAME
 *     tier NAME ram|storage CAPACITY_BYTES        (fastest first, exactly one storage tier)
 * The placement that uses them lives in ple_model.c (it mirrors plelab/edge/placement.py). */
#include "ple.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "devices.inc"

/* Parse `text`; with `want` pick that device, else require exactly one. 1 found, 0 not found, -1 error. */
static int parse(const char *text, const char *want, ple_device *dev, char *err, const char *origin) {
    ple_device cur;
    int have = 0, found = 0, line_no = 0;
    const char *p = text;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[256], a[64], b[64], c[64], e[64], extra[2];
        line_no++;
        if (len >= sizeof line) {
            snprintf(err, PLE_ERR, "%s: line %d is too long", origin, line_no);
            return -1;
        }
        memcpy(line, p, len);
        line[len] = 0;
        p += len + (eol != NULL);
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        int n = sscanf(line, "%63s %63s %63s %63s %1s", a, b, c, e, extra);
        if (n <= 0) continue;
        if (!strcmp(a, "device") && n == 2 && strlen(b) < sizeof cur.name) {
            if (have && (!want || !strcmp(cur.name, want))) {
                *dev = cur;
                found++;
            }
            memset(&cur, 0, sizeof cur);
            strcpy(cur.name, b);
            have = 1;
            continue;
        }
        if (!strcmp(a, "tier") && n == 4 && have && cur.n_tiers < PLE_MAX_TIERS && strlen(b) < 32 &&
            (!strcmp(c, "ram") || !strcmp(c, "storage")) && e[0] >= '0' && e[0] <= '9') {
            char *end;
            unsigned long long cap = strtoull(e, &end, 10);
            if (*end == 0 && cap > 0) {
                ple_tier *t = &cur.tiers[cur.n_tiers++];
                strcpy(t->name, b);
                t->storage = !strcmp(c, "storage");
                t->capacity = cap;
                continue;
            }
        }
        snprintf(err, PLE_ERR, "%s: line %d is not 'device NAME' or 'tier NAME ram|storage BYTES'", origin, line_no);
        return -1;
    }
    if (have && (!want || !strcmp(cur.name, want))) {
        *dev = cur;
        found++;
    }
    if (!want && found != 1) {
        snprintf(err, PLE_ERR, "%s: a profile file holds exactly one device, found %d", origin, found);
        return -1;
    }
    if (!found) return 0;
    int storage = 0;
    for (int i = 0; i < dev->n_tiers; i++) storage += dev->tiers[i].storage;
    if (storage != 1 || dev->n_tiers < 2) {
        snprintf(err, PLE_ERR, "%s: device %s needs exactly one storage tier and at least one ram tier", origin,
                 dev->name);
        return -1;
    }
    return 1;
}

int ple_device_load(const char *name_or_file, ple_device *dev, char *err) {
    int rc = parse(BUILTIN_DEVICES, name_or_file, dev, err, "built-in devices");
    if (rc) return rc < 0 ? -1 : 0;
    FILE *f = fopen(name_or_file, "rb");
    if (!f) {
        snprintf(err, PLE_ERR, "unknown device '%s' (built in: %s; or pass a profile file)", name_or_file,
                 ple_device_names());
        return -1;
    }
    enum { MAX_TEXT = 8192 };
    char *text = malloc(MAX_TEXT); /* on the heap: an MCU task's whole stack can be this small */
    if (!text) {
        fclose(f);
        snprintf(err, PLE_ERR, "out of memory reading the profile file %s", name_or_file);
        return -1;
    }
    size_t n = fread(text, 1, MAX_TEXT - 1, f);
    int big = !feof(f);
    fclose(f);
    rc = -1;
    if (big) {
        snprintf(err, PLE_ERR, "%s: profile file larger than %d bytes", name_or_file, MAX_TEXT - 1);
    } else if (text[n] = 0, memchr(text, 0, n)) {
        snprintf(err, PLE_ERR, "%s: not a text profile", name_or_file);
    } else {
        rc = parse(text, NULL, dev, err, name_or_file) == 1 ? 0 : -1;
    }
    free(text);
    return rc;
}

const char *ple_device_names(void) { return BUILTIN_DEVICE_NAMES; }
