/* The model's final projection with float32 sums and a float32 result over bfloat16 operands
   (float_logits.py says why). The weight is packed once into 16-row blocks of column pairs
   ([blocks][pairs][16][2], the layout AVX512-BF16's dot product reads): one instruction then
   adds two columns' products to 16 vocabulary entries of one row, so no horizontal sums are
   needed, and each block of the weight is read from memory once, then from cache for the
   next rows. Rows go in runs of 8, then 4, 2 and 1, two blocks at a time, each run's sums held in
   registers.
   Where the CPU has AMX, `amx_logits` does the same with tile products instead (16 rows and
   32 columns a step; the packed layout is AMX's B tile as it is), at the speed of oneDNN's own
   bfloat16 product. Each returns -1 where it was not compiled in or AMX is not granted
   (float_logits.py then tries the next, and at last keeps float32 weights). */
#include "amx.h"
#include "bf16.h"

#if defined(__AVX512BF16__)
/* Rows i < N of x against BLOCKS (1 or 2) consecutive 16-entry blocks of the weight: each
   weight vector is loaded once for all N rows, each x pair broadcast once for both blocks. Two
   blocks at a time keep 2 × N sums in flight: on the AMD EPYC (AVX512-BF16, no AMX) 16 rows
   of Gemma 3's 262,144 × 640 head took 17.6–19.1 against 22.2–23.9 ms one block at a time
   (two runs), 8 rows 11.2 against 12.5; SmolLM2's 49,152 × 576 at 16 rows 3.3–4.1 against
   4.1–4.8. Each sum is the same dot products in the same order either way. */
#define RUN(N, BLOCKS)                                                                          \
    static inline void run##N##x##BLOCKS(const int32_t *xs, long pairs, const bf16 *w,         \
                                         float *out, long vocab, __mmask16 mask) {              \
        __m512 acc[BLOCKS][N];                                                                  \
        for (int k = 0; k < BLOCKS; ++k)                                                        \
            for (int i = 0; i < N; ++i) acc[k][i] = _mm512_setzero_ps();                        \
        for (long p = 0; p < pairs; ++p) {                                                      \
            __m512bh wv[BLOCKS];                                                                \
            for (int k = 0; k < BLOCKS; ++k)                                                    \
                wv[k] = (__m512bh)_mm512_loadu_si512((const void *)(w + (k * pairs + p) * 32)); \
            for (int i = 0; i < N; ++i) {                                                       \
                __m512bh xv = (__m512bh)_mm512_set1_epi32(xs[i * pairs + p]);                   \
                for (int k = 0; k < BLOCKS; ++k) acc[k][i] = _mm512_dpbf16_ps(acc[k][i], wv[k], xv); \
            }                                                                                   \
        }                                                                                       \
        for (int i = 0; i < N; ++i) {                                                           \
            for (int k = 0; k < BLOCKS - 1; ++k) _mm512_storeu_ps(out + i * vocab + 16 * k, acc[k][i]); \
            _mm512_mask_storeu_ps(out + i * vocab + 16 * (BLOCKS - 1), mask, acc[BLOCKS - 1][i]); \
        }                                                                                       \
    }
RUN(8, 1)
RUN(4, 1)
RUN(2, 1)
RUN(1, 1)
RUN(8, 2)
RUN(4, 2)
RUN(2, 2)
RUN(1, 2)

#define RUNS(BLOCKS)                                                                            \
    static void runs##BLOCKS(const bf16 *x, long rows, long pairs, const bf16 *w, float *out,   \
                             long vocab, __mmask16 mask) {                                      \
        long r = 0;                                                                             \
        for (; r + 8 <= rows; r += 8)                                                           \
            run8x##BLOCKS((const int32_t *)(x + r * 2 * pairs), pairs, w, out + r * vocab, vocab, mask); \
        for (int n = 4; n >= 1; n /= 2) /* the rest in runs of 4, 2 and 1 */                    \
            if (rows - r >= n) {                                                                \
                const int32_t *xs = (const int32_t *)(x + r * 2 * pairs);                       \
                float *o = out + r * vocab;                                                     \
                if (n == 4) run4x##BLOCKS(xs, pairs, w, o, vocab, mask);                        \
                else if (n == 2) run2x##BLOCKS(xs, pairs, w, o, vocab, mask);                   \
                else run1x##BLOCKS(xs, pairs, w, o, vocab, mask);                               \
                r += n;                                                                         \
            }                                                                                   \
    }
RUNS(1)
RUNS(2)
#endif

/* out [rows, vocab] = x [rows, 2 × pairs] · weight^T, `packed` as above. */
int bf16_logits(const bf16 *x, long rows, const bf16 *packed, long blocks, long pairs,
                float *out, long vocab, int threads) {
#if defined(__AVX512BF16__)
    long duos = (blocks + 1) / 2; /* blocks two at a time; an odd count's last alone */
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long d = 0; d < duos; ++d) {
        long b = 2 * d, first = b * 16, left = vocab - first - (b + 1 < blocks ? 16 : 0);
        __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
        const bf16 *w = packed + b * pairs * 32;
        if (b + 1 == blocks)
            runs1(x, rows, pairs, w, out + first, vocab, mask);
        else if (rows >= 8)
            runs2(x, rows, pairs, w, out + first, vocab, mask);
        else { /* few rows: one block at a time (two at once were no faster, and in one run
                  of two 1.9 against 1.7 ms for one row of SmolLM2's head) */
            runs1(x, rows, pairs, w, out + first, vocab, (__mmask16)0xffff);
            runs1(x, rows, pairs, w + pairs * 32, out + first + 16, vocab, mask);
        }
    }
    return 0;
#else
    (void)x, (void)rows, (void)packed, (void)blocks, (void)pairs, (void)out, (void)vocab;
    (void)threads;
    return -1;
#endif
}

/* out [rows, vocab] = x [rows, 32 × chunks] · weight^T with AMX tiles: `rows` a multiple of 16
   (the caller pads), `packed` [blocks][16 × chunks pairs][16][2]. Tile 0 holds a block's sums
   for 16 rows, tile 1 16 rows of x over 32 columns, tile 2 the weight's block over those
   columns. Linux hands a process AMX's state only when asked (arch_prctl), so it asks. */
int amx_logits(const bf16 *x, long rows, const bf16 *packed, long blocks, long chunks,
               float *out, long vocab, int threads) {
#if defined(__AMX_BF16__) && defined(__AMX_TILE__)
    if (rows % 16 || !amx_granted()) return -1;
    long stride = 32 * chunks; /* x's row, in values */
#pragma omp parallel num_threads(threads)
    {
        amx_configure(3);
#pragma omp for schedule(static)
        for (long b = 0; b < blocks; ++b) {
            const bf16 *w = packed + b * chunks * 512;
            long first = b * 16, left = vocab - first;
            for (long r = 0; r < rows; r += 16) {
                _tile_zero(0);
                for (long c = 0; c < chunks; ++c) {
                    _tile_loadd(1, x + r * stride + c * 32, stride * 2);
                    _tile_loadd(2, w + c * 512, 64);
                    _tile_dpbf16ps(0, 1, 2);
                }
                if (left >= 16) {
                    _tile_stored(0, out + r * vocab + first, vocab * 4);
                } else { /* the last block's columns past the vocabulary are not stored */
                    float tail[256];
                    _tile_stored(0, tail, 64);
                    for (int i = 0; i < 16; ++i)
                        memcpy(out + (r + i) * vocab + first, tail + i * 16, left * sizeof(float));
                }
            }
        }
        _tile_release();
    }
    return 0;
#else
    (void)x, (void)rows, (void)packed, (void)blocks, (void)chunks, (void)out, (void)vocab;
    (void)threads;
    return -1;
#endif
}
