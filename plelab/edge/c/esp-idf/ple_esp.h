/* ESP-IDF storage for the plelab C runtime: the .ple file written raw into a data partition. */
#ifndef PLE_ESP_H
#define PLE_ESP_H

#include "ple.h"

/* Open the data partition `label` holding a .ple file: records are read with esp_partition_read, or from
 * an esp_partition_mmap window when the MMU has room for the whole file (then `map` works as well).
 * 0, or -1 with err set. */
int ple_storage_esp_partition(ple_storage *s, const char *label, char *err);

#endif
