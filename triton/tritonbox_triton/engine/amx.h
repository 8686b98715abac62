/* AMX as the engine's C passes use it (logits_kernel.c, amx_linear.c): Linux hands a process
   AMX's tile state only when asked (arch_prctl), and each thread loads a tile configuration of
   its own; every tile here is 16 rows of 64 bytes (16 floats, or 32 bfloat16). */
#ifndef TRITONBOX_AMX_H
#define TRITONBOX_AMX_H

#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
#include <immintrin.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* Whether Linux grants this process AMX's state. */
static inline int amx_granted(void) {
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* This thread's tiles 0 to `tiles` - 1, each 16 rows of 64 bytes. */
static inline void amx_configure(int tiles) {
    tile_config config = {0};
    config.palette_id = 1;
    for (int t = 0; t < tiles; ++t) config.rows[t] = 16, config.colsb[t] = 64;
    _tile_loadconfig(&config);
}
#endif

#endif
