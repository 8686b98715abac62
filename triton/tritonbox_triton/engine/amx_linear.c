/* bfloat16 products of a few rows by AMX tiles (amx_linear.py says where and why): each output
   is its row's float32 sum over the inner size in tiles of 32 columns, in ascending order, plus
   the bias, rounded to bfloat16 once. A row's sums are the same whichever rows share the call.
   The weight is float_logits.py's packing, [blocks of 16 outputs][inner / 32][16 pairs][16][2]
   (AMX's B tile as it is), so a range of whole blocks is a product of its own (q, k and v of one
   packed weight).
   16 rows (a decode step): four blocks at a time, one tile of x for four weight tiles, each
   block's sums in a tile of their own: on 2 Xeon cores with AMX SmolLM2-135M's 30 layers took
   9.9–10.1 ms against oneDNN's prepacked 12.4–13.2 (the weights read at ~21 GB/s against
   ~16). More rows: two tiles of rows by two blocks. Software prefetch made no difference. */
#include "amx.h"
#include "bf16.h"

#define PANEL 128 /* rows per work item beyond a decode step */

#if defined(__AMX_BF16__) && defined(__AMX_TILE__)

/* One tile's float32 sums (16 rows × 16 outputs from `first`) plus the bias, rounded as
   c10::BFloat16 rounds, into `out`'s rows; outputs past the weight's are not stored. */
static inline void finish(const float *sums, const float *bias, long first, long outputs,
                          bf16 *out) {
    long left = outputs - first;
    __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + first) : _mm512_setzero_ps();
    for (long i = 0; i < 16; ++i) {
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
    for (int j = 0; j < 4; ++j) finish(sums[j], bias, (block + j) * 16, outputs, out);
}

/* One or two blocks from `block` (`two`): the finished sums of 32 rows (`pair`) or 16. */
static inline void finish_rows(float (*sums)[256], const float *bias, long block, int two,
                               int pair, long outputs, bf16 *out) {
    for (long k = 0; k < 1 + two; ++k) {
        finish(sums[k], bias, (block + k) * 16, outputs, out);
        if (pair) finish(sums[2 + k], bias, (block + k) * 16, outputs, out + 16 * outputs);
    }
}

/* Rows [first, last) (whole tiles) by one or two blocks from `block` (`two`), 32 rows at a
   time: each 32 rows' sums are finished after the next 32's tile work is issued, so the core
   rounds them while the AMX unit multiplies (finishing in turn left it idle ~20% of the time). */
static inline void panel(const bf16 *x, long stride, const bf16 *w, long chunks,
                         const float *bias, long block, int two, long first, long last,
                         long outputs, bf16 *out, float (*sums)[4][256]) {
    long bs = chunks * 512, previous = -1;
    for (long r = first; r < last; r += 32) {
        int pair = r + 32 <= last;
        const bf16 *xr = x + r * stride;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (long c = 0; c < chunks; ++c) {
            const bf16 *wc = w + c * 512;
            _tile_loadd(4, xr + c * 32, stride * 2);
            _tile_loadd(6, wc, 64);
            _tile_dpbf16ps(0, 4, 6);
            if (pair) {
                _tile_loadd(5, xr + 16 * stride + c * 32, stride * 2);
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
                        out + previous * outputs);
        float(*mine)[256] = sums[(r / 32) & 1];
        _tile_stored(0, mine[0], 64);
        _tile_stored(1, mine[1], 64);
        _tile_stored(2, mine[2], 64);
        _tile_stored(3, mine[3], 64);
        if (!pair) finish_rows(mine, bias, block, two, 0, outputs, out + r * outputs);
        previous = pair ? r : -1;
    }
    if (previous >= 0)
        finish_rows(sums[(previous / 32) & 1], bias, block, two, 1, outputs,
                    out + previous * outputs);
}
#endif

/* out [rows, outputs] (bfloat16) = x [rows, 32 × chunks] · weight^T + bias (float32, or NULL),
   `rows` a multiple of 16 (the caller pads), `packed` [blocks][chunks][512] with blocks =
   ⌈outputs / 16⌉. -1 where AMX is not compiled in or not granted (Linux hands a process AMX's
   state only when asked). */
int amx_linear(const bf16 *x, long rows, const bf16 *packed, long blocks, long chunks,
               const float *bias, bf16 *out, long outputs, int threads) {
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
    if (rows % 16 || !amx_granted()) return -1;
    long stride = 32 * chunks;
    /* A decode step's 16 rows: groups of four blocks. Else pairs of blocks by panels of
       PANEL rows, so two threads share out even a short weight and a pair's weight is read
       once per panel while the panel's rows stay in the core's cache. */
    long items = rows == 16 ? (blocks + 3) / 4 : ((blocks + 1) / 2) * ((rows + PANEL - 1) / PANEL);
    long panels = (rows + PANEL - 1) / PANEL;
#pragma omp parallel num_threads(threads)
    {
        amx_configure(8);
        float sums[2][4][256] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (long item = 0; item < items; ++item) {
            if (rows == 16) {
                long block = 4 * item, count = blocks - block < 4 ? blocks - block : 4;
                const bf16 *w = packed + block * chunks * 512;
                if (count == 4) {
                    four_blocks(x, stride, w, chunks, bias, block, outputs, out, sums[0]);
                    continue;
                }
                for (long j = 0; j < count; j += 2)
                    panel(x, stride, w + j * chunks * 512, chunks, bias, block + j, j + 1 < count,
                          0, 16, outputs, out, sums);
                continue;
            }
            long block = 2 * (item / panels), first = (item % panels) * PANEL;
            long last = first + PANEL < rows ? first + PANEL : rows;
            panel(x, stride, packed + block * chunks * 512, chunks, bias, block,
                  block + 1 < blocks, first, last, outputs, out, sums);
        }
        _tile_release();
    }
    return 0;
#else
    (void)x, (void)rows, (void)packed, (void)blocks, (void)chunks, (void)bias, (void)out;
    (void)outputs, (void)threads;
    return -1;
#endif
}
