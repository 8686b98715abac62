/* bfloat16 products by AMX tiles (amx_linear.py says where and why): each output is its row's
   float32 sum over the inner size in tiles of 32 columns, in ascending order, plus the bias,
   rounded to bfloat16 once. A row's sums are the same whichever rows share the call.
   The weight is float_logits.py's packing, [blocks of 16 outputs][inner / 32][16 pairs][16][2]
   (AMX's B tile as it is), so a range of whole blocks is a product of its own (q, k and v of one
   packed weight).
   16 rows (a decode step): each thread an even share of the blocks, four at a time, one tile of
   x for four weight tiles, each block's sums in a tile of their own: on 2 Xeon cores with AMX
   SmolLM2-135M's 30 layers take 7.6–8.3 ms against oneDNN's prepacked 12.4–13.2 (the weights
   read at ~27 GB/s against ~16). More rows: two tiles of rows by two blocks, by panels of
   PANEL rows. A last part tile of rows is copied once, zero-padded, so the caller passes its
   rows as they are (padding them in PyTorch was a tenth of a served step's time). Software
   prefetch made no difference. */
#include "amx.h"
#include "bf16.h"
#include <omp.h>
#include <stdlib.h>

#define PANEL 128 /* rows per work item beyond a decode step */

#if defined(__AMX_BF16__) && defined(__AMX_TILE__)

/* The input's rows by tiles of 16: whole tiles from x, the last part tile (if any) from
   `tail`, a zero-padded copy of its rows. */
typedef struct {
    const bf16 *x, *tail;
    long stride, rows, whole;
} Rows;

static inline const bf16 *tile_of(const Rows *in, long tile) {
    return tile < in->whole ? in->x + tile * 16 * in->stride : in->tail;
}

static inline long live_of(const Rows *in, long tile) {
    return tile < in->whole ? 16 : in->rows - 16 * in->whole;
}

/* One tile's float32 sums (`live` rows × 16 outputs from `first`) plus the bias, rounded as
   c10::BFloat16 rounds, into `out`'s rows; outputs past the weight's are not stored. */
static inline void finish(const float *sums, const float *bias, long first, long outputs,
                          bf16 *out, long live) {
    long left = outputs - first;
    __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + first) : _mm512_setzero_ps();
    for (long i = 0; i < live; ++i) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(sums + 16 * i), b);
        __m512i u = _mm512_srli_epi32(_mm512_castps_si512(round16(v)), 16);
        _mm256_mask_storeu_epi16(out + i * outputs + first, mask, _mm512_cvtepi32_epi16(u));
    }
}

/* Four blocks from `block` for 16 rows. */
static inline void four_blocks(const bf16 *x, long stride, const bf16 *w, long chunks,
                               const float *bias, long block, long outputs, bf16 *out,
                               float (*sums)[256]) {
    long bs = chunks * 512; /* one block of the weight, in values */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long c = 0; c < chunks; ++c) {
        const bf16 *wc = w + c * 512;
        _tile_loadd(4, x + c * 32, stride * 2);
        _tile_loadd(5, wc, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, wc + bs, 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, wc + 2 * bs, 64);
        _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(6, wc + 3 * bs, 64);
        _tile_dpbf16ps(3, 4, 6);
    }
    _tile_stored(0, sums[0], 64);
    _tile_stored(1, sums[1], 64);
    _tile_stored(2, sums[2], 64);
    _tile_stored(3, sums[3], 64);
    for (int j = 0; j < 4; ++j) finish(sums[j], bias, (block + j) * 16, outputs, out, 16);
}

/* One or two blocks from `block` (`two`): the finished sums of the 16 or 32 (`pair`) rows
   from tile `tile` of `in`, into `out` (those rows' outputs). */
static inline void finish_rows(float (*sums)[256], const float *bias, long block, int two,
                               int pair, long outputs, bf16 *out, const Rows *in, long tile) {
    for (long k = 0; k < 1 + two; ++k) {
        finish(sums[k], bias, (block + k) * 16, outputs, out, live_of(in, tile));
        if (pair)
            finish(sums[2 + k], bias, (block + k) * 16, outputs, out + 16 * outputs,
                   live_of(in, tile + 1));
    }
}

/* Rows [first, last) (whole tiles, the last maybe part) by one or two blocks from `block`
   (`two`), 32 rows at a time: each 32 rows' sums are finished after the next 32's tile work
   is issued, so the core rounds them while the AMX unit multiplies (finishing in turn left it
   idle ~20% of the time). */
static inline void panel(const Rows *in, const bf16 *w, long chunks, const float *bias,
                         long block, int two, long first, long last, long outputs, bf16 *out,
                         float (*sums)[4][256]) {
    long bs = chunks * 512, previous = -1, stride = in->stride;
    for (long r = first; r < last; r += 32) {
        int pair = r + 32 <= last;
        const bf16 *x0 = tile_of(in, r / 16), *x1 = pair ? tile_of(in, r / 16 + 1) : x0;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (long c = 0; c < chunks; ++c) {
            const bf16 *wc = w + c * 512;
            _tile_loadd(4, x0 + c * 32, stride * 2);
            _tile_loadd(6, wc, 64);
            _tile_dpbf16ps(0, 4, 6);
            if (pair) {
                _tile_loadd(5, x1 + c * 32, stride * 2);
                _tile_dpbf16ps(2, 5, 6);
            }
            if (two) {
                _tile_loadd(7, wc + bs, 64);
                _tile_dpbf16ps(1, 4, 7);
                if (pair) _tile_dpbf16ps(3, 5, 7);
            }
        }
        if (previous >= 0)
            finish_rows(sums[(previous / 32) & 1], bias, block, two, 1, outputs,
                        out + previous * outputs, in, previous / 16);
        float(*mine)[256] = sums[(r / 32) & 1];
        _tile_stored(0, mine[0], 64);
        _tile_stored(1, mine[1], 64);
        _tile_stored(2, mine[2], 64);
        _tile_stored(3, mine[3], 64);
        if (!pair) finish_rows(mine, bias, block, two, 0, outputs, out + r * outputs, in, r / 16);
        previous = pair ? r : -1;
    }
    if (previous >= 0)
        finish_rows(sums[(previous / 32) & 1], bias, block, two, 1, outputs,
                    out + previous * outputs, in, previous / 16);
}
#endif

/* out [rows, outputs] (bfloat16) = x [rows, 32 × chunks] · weight^T + bias (float32, or NULL),
   `packed` [blocks][chunks][512] with blocks =
   ⌈outputs / 16⌉. -1 where AMX is not compiled in or not granted (Linux hands a process AMX's
   state only when asked). */
int amx_linear(const bf16 *x, long rows, const bf16 *packed, long blocks, long chunks,
               const float *bias, bf16 *out, long outputs, int threads) {
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
    if (!amx_granted()) return -1;
    long stride = 32 * chunks, padded = (rows + 15) / 16 * 16;
    /* A part tile's rows copied once, zero-padded: a tile load reads 16 rows. */
    bf16 *tail = NULL;
    if (rows % 16) {
        tail = calloc((size_t)(16 * stride), sizeof(bf16));
        if (!tail) return -2;
        memcpy(tail, x + rows / 16 * 16 * stride, (size_t)(rows % 16 * stride) * sizeof(bf16));
    }
    Rows in = {x, tail, stride, rows, rows / 16};
    long panels = (padded + PANEL - 1) / PANEL, items = ((blocks + 1) / 2) * panels;
#pragma omp parallel num_threads(threads)
    {
        amx_configure(8);
        float sums[2][4][256] __attribute__((aligned(64)));
        if (rows == 16) {
            /* A decode step: each thread an even share of the blocks, four at a time (one
               tile of x for four weight tiles), its last one or two as a pair. */
            long share = omp_get_num_threads(), me = omp_get_thread_num();
            long block = blocks * me / share, end = blocks * (me + 1) / share;
            for (; block + 4 <= end; block += 4)
                four_blocks(x, stride, packed + block * chunks * 512, chunks, bias, block,
                            outputs, out, sums[0]);
            for (; block < end; block += 2)
                panel(&in, packed + block * chunks * 512, chunks, bias, block, block + 1 < end,
                      0, 16, outputs, out, sums);
        } else {
            /* Pairs of blocks by panels of PANEL rows, so two threads share out even a short
               weight and a pair's weight is read once per panel while the panel's rows stay
               in the core's cache. */
#pragma omp for schedule(static)
            for (long item = 0; item < items; ++item) {
                long block = 2 * (item / panels), first = (item % panels) * PANEL;
                long last = first + PANEL < padded ? first + PANEL : padded;
                panel(&in, packed + block * chunks * 512, chunks, bias, block,
                      block + 1 < blocks, first, last, outputs, out, sums);
            }
        }
        _tile_release();
    }
    free(tail);
    return 0;
#else
    (void)x, (void)rows, (void)packed, (void)blocks, (void)chunks, (void)bias, (void)out;
    (void)outputs, (void)threads;
    return -1;
#endif
}
