/* bfloat16 products on CPUs with AVX2 and no native bfloat16 (linear_kernel.py says why).

   Each output is PyTorch's own dot product for bfloat16 there (ATen's dot_with_fp32_arith,
   which both its matrix-vector and matrix-matrix paths call once per output): the operands
   widened to float32, eight float32 accumulators of 8 lanes each, accumulator q summing
   positions 64c + 8q + lane over the chunks c of 64 in order with fused multiply-adds; then
   the accumulators added as a tree (q + q+4, then + q+2, then + q+1), the 8 lanes as ATen's
   AVX2 `vec_reduce_all` adds them (lane i + i^4, i^2, i^1), and the result rounded to
   bfloat16 once (with the bias added first, as addmm does). A product of two bfloat16 values
   is exact in float32, so the fused and unfused multiply-adds agree and only this order
   matters. Inner sizes that are not a multiple of 64 have tails whose order was not matched:
   `tb_linear` refuses them (-2) and the caller keeps PyTorch's product, unless told that its
   own order is wanted (`any_inner`: linear_kernel.py, on AVX-512 without native bfloat16).

   What differs from ATen is only the loop order around those sums: ATen walks one output at
   a time and reads each weight row once per input row; here a tile of up to 3 rows × 4
   outputs shares every load, and one accumulator q of the tile is summed over all chunks
   before the next (the 8 are independent sums), so 12 of them fit in registers. On 2 AVX2
   cores (SmolLM2-135M's 30 layers and head, weights streamed from memory) 8 rows took 45
   against ATen's 129 ms and MKL's float32 95 ms. */
#include "bf16.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

static inline __m256 widen8(const bf16 *p) {
    __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

/* ATen's AVX2 vec_reduce_all with +. */
static inline float lanes_sum(__m256 v) {
    v = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0x4E));
    v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0xB1));
    return _mm256_cvtss_f32(v);
}

/* One output from its 8 accumulators, plus the positions past the last whole chunk. */
static inline float finish(const __m256 s[8], const float *x, const bf16 *w, long k) {
    __m256 a0 = _mm256_add_ps(s[0], s[4]), a1 = _mm256_add_ps(s[1], s[5]);
    __m256 a2 = _mm256_add_ps(s[2], s[6]), a3 = _mm256_add_ps(s[3], s[7]);
    float sum = lanes_sum(_mm256_add_ps(_mm256_add_ps(a0, a2), _mm256_add_ps(a1, a3)));
    __m256 tail = _mm256_setzero_ps();
    for (long j = k & ~63L; j < (k & ~15L); j += 16) {
        tail = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), widen8(w + j), tail);
        tail = _mm256_fmadd_ps(_mm256_loadu_ps(x + j + 8), widen8(w + j + 8), tail);
    }
    sum += lanes_sum(tail);
    for (long j = k & ~15L; j < k; ++j) sum += x[j] * widen(w[j]);
    return sum;
}

/* Rows [0, NR) × outputs [0, NF) of x [rows][k] against w [outputs][k]: their float32 sums
   into sums[r * n + f]. QB accumulators of each pair are summed side by side (more chains in
   flight where the tile is small). */
#define TILE(QB, NR, NF)                                                                        \
    static void tile##QB##_##NR##x##NF(const float *x, long k, const bf16 *w, float *sums,    \
                                         long n) {                                              \
        __m256 s[NR][NF][8];                                                                    \
        long chunks = k >> 6;                                                                   \
        for (int q0 = 0; q0 < 8; q0 += QB) {                                                    \
            __m256 acc[QB][NR][NF];                                                             \
            for (int b = 0; b < QB; ++b)                                                        \
                for (int r = 0; r < NR; ++r)                                                    \
                    for (int f = 0; f < NF; ++f) acc[b][r][f] = _mm256_setzero_ps();            \
            for (long c = 0; c < chunks; ++c)                                                   \
                for (int b = 0; b < QB; ++b) {                                                  \
                    long at = c * 64 + (q0 + b) * 8;                                            \
                    __m256 xv[NR];                                                              \
                    for (int r = 0; r < NR; ++r) xv[r] = _mm256_loadu_ps(x + r * k + at);       \
                    for (int f = 0; f < NF; ++f) {                                              \
                        __m256 wv = widen8(w + f * k + at);                                     \
                        for (int r = 0; r < NR; ++r)                                            \
                            acc[b][r][f] = _mm256_fmadd_ps(xv[r], wv, acc[b][r][f]);            \
                    }                                                                           \
                }                                                                               \
            for (int b = 0; b < QB; ++b)                                                        \
                for (int r = 0; r < NR; ++r)                                                    \
                    for (int f = 0; f < NF; ++f) s[r][f][q0 + b] = acc[b][r][f];                \
        }                                                                                       \
        for (int r = 0; r < NR; ++r)                                                            \
            for (int f = 0; f < NF; ++f)                                                        \
                sums[r * n + f] = finish(s[r][f], x + r * k, w + f * k, k);                     \
    }
TILE(1, 3, 4)
TILE(1, 2, 4)
TILE(4, 1, 2)
TILE(1, 1, 1)

/* Outputs [first, first + 4) (or the last few, one at a time) for every row. The next 4
   outputs' weight rows are fetched meanwhile: a tile reads its rows 16 bytes in every 128 at a
   time (one accumulator's lanes), a pattern the hardware prefetchers follow poorly. With it a
   decode step's products read at 17-21 GB/s where they read at 12-13 (2 rows, 2 cores). */
static void outputs(const float *x, long rows, const bf16 *w, long n, long k, long first,
                    float *sums) {
    const bf16 *wf = w + first * k;
    const char *next = (const char *)(wf + 4 * k);
    if (first + 8 <= n)
        for (long at = 0; at < 4 * k * 2; at += 64) _mm_prefetch(next + at, _MM_HINT_T0);
    if (n - first < 4) {
        for (long f = first; f < n; ++f)
            for (long r = 0; r < rows; ++r) tile1_1x1(x + r * k, k, w + f * k, sums + r * n + f, n);
        return;
    }
    long r = 0;
    for (; r + 3 <= rows; r += 3) tile1_3x4(x + r * k, k, wf, sums + r * n + first, n);
    for (; r + 2 <= rows; r += 2) tile1_2x4(x + r * k, k, wf, sums + r * n + first, n);
    for (; r < rows; ++r) {
        tile4_1x2(x + r * k, k, wf, sums + r * n + first, n);
        tile4_1x2(x + r * k, k, wf + 2 * k, sums + r * n + first + 2, n);
    }
}

/* sums [rows][n] float32 = x [rows][k] (float32, widened bfloat16) · w [n][k] (bfloat16). */
int tb_sums(const float *x, long rows, const bf16 *w, long n, long k, float *sums, int threads) {
    long blocks = (n + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long b = 0; b < blocks; ++b) outputs(x, rows, w, n, k, 4 * b, sums);
    return 0;
}

/* F.linear(x, w, bias) in bfloat16 as ATen computes it on this CPU: out [rows][n], `sums` a
   float32 scratch of the same shape. Each block of outputs is rounded by the thread that summed
   it, in one parallel region: a decode step makes ~70 of these calls, and waking the workers a
   second time per call cost more than the rounding. */
int tb_linear(const float *x, long rows, const bf16 *w, long n, long k, const bf16 *bias,
              float *sums, bf16 *out, int threads, _Bool any_inner) {
    if (k % 64 && !any_inner) return -2;
    long blocks = (n + 3) / 4;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long b = 0; b < blocks; ++b) {
        long first = 4 * b, last = first + 4 < n ? first + 4 : n;
        outputs(x, rows, w, n, k, first, sums);
        for (long r = 0; r < rows; ++r)
            for (long f = first; f < last; ++f) {
                float sum = sums[r * n + f];
                out[r * n + f] = narrow(bias ? sum + widen(bias[f]) : sum);
            }
    }
    return 0;
}

#else
int tb_sums(const float *x, long rows, const bf16 *w, long n, long k, float *sums, int threads) {
    (void)x, (void)rows, (void)w, (void)n, (void)k, (void)sums, (void)threads;
    return -1;
}

int tb_linear(const float *x, long rows, const bf16 *w, long n, long k, const bf16 *bias,
              float *sums, bf16 *out, int threads, _Bool any_inner) {
    (void)x, (void)rows, (void)w, (void)n, (void)k, (void)bias, (void)sums, (void)out,
        (void)threads, (void)any_inner;
    return -1;
}
#endif
