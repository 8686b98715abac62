/* The decode step's elementwise work in one pass per layer stage, each value rounded exactly as
   PyTorch's own operations round it (fused_ops.py says why and how that is checked). Built with
   -ffp-contract=off: a fused multiply-add would round once where PyTorch rounds twice. Rows are
   shared among `threads` OpenMP threads when there are enough of them (a prefill's): the
   library is linked against the libgomp torch has loaded, so they are torch's own workers. */
#include <math.h>

#include "bf16.h"

/* Below this many values a pass runs on the calling thread alone: a decode step's rows are
   cheaper to do than to share. */
#define PARALLEL_MIN 65536

static int ceil_log2(long x) { return x <= 1 ? 0 : 64 - __builtin_clzl((unsigned long)(x - 1)); }

#define MAX_LANES 16
#define MAX_COLUMNS 16384
#define MAX_HEAD 1024 /* the widest head the q/k norms take */

/* The sum of a contiguous float row in the order of ATen's CPU reduction (SumKernel.cpp,
   vectorized_inner_sum over row_sum): `lanes`-wide vectors summed into four interleaved
   accumulators with cascade levels, the leftover vectors, the accumulators in turn, then the
   scalar tail and the lanes one by one. Inlined with `lanes` a constant (aten_row_sum): the
   lanes' loops become one vector each. */
static inline __attribute__((always_inline)) float row_sum(const float *x, long n, int lanes) {
    long vectors = n / lanes, size = vectors / 4;
    int level_power = ceil_log2(size) / 4;
    if (level_power < 4) level_power = 4;
    long level_step = 1L << level_power, level_mask = level_step - 1;
    float acc[4][4][MAX_LANES];
    for (int j = 0; j < 4; ++j)
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < lanes; ++l) acc[j][k][l] = 0.f;
    long i = 0;
    while (i + level_step <= size) {
        for (long j = 0; j < level_step; ++j, ++i)
            for (int k = 0; k < 4; ++k)
                for (int l = 0; l < lanes; ++l) acc[0][k][l] += x[(i * 4 + k) * lanes + l];
        for (int j = 1; j < 4; ++j) {
            for (int k = 0; k < 4; ++k)
                for (int l = 0; l < lanes; ++l) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.f;
                }
            if ((i & (level_mask << (j * level_power))) != 0) break;
        }
    }
    for (; i < size; ++i)
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < lanes; ++l) acc[0][k][l] += x[(i * 4 + k) * lanes + l];
    for (int j = 1; j < 4; ++j)
        for (int k = 0; k < 4; ++k)
            for (int l = 0; l < lanes; ++l) acc[0][k][l] += acc[j][k][l];
    for (long v = size * 4; v < vectors; ++v)
        for (int l = 0; l < lanes; ++l) acc[0][0][l] += x[v * lanes + l];
    for (int k = 1; k < 4; ++k)
        for (int l = 0; l < lanes; ++l) acc[0][0][l] += acc[0][k][l];
    float total = 0.f;
    for (long t = vectors * lanes; t < n; ++t) total += x[t];
    for (int l = 0; l < lanes; ++l) total += acc[0][0][l];
    return total;
}

float aten_row_sum(const float *x, long n, int lanes) {
    return lanes == 8 ? row_sum(x, n, 8) : lanes == 16 ? row_sum(x, n, 16) : row_sum(x, n, lanes);
}

/* out = RMSNorm of one row of `columns` values: Llama's (float32 mean of squares, rsqrt, product,
   back to bfloat16, times the bfloat16 `weight`) or, with `shifted` (1 + w in float32) instead,
   Gemma's (the product times 1 + w in float32, then back to bfloat16). */
static void norm_row(const bf16 *h, const bf16 *weight, const float *shifted, bf16 *o,
                     long columns, float eps, int lanes, float *squares) {
    long c = 0;
#ifdef __AVX512F__
    for (; c + 16 <= columns; c += 16) {
        __m512 x = widen16(h + c);
        _mm512_storeu_ps(squares + c, _mm512_mul_ps(x, x));
    }
#endif
    for (; c < columns; ++c) {
        float x = widen(h[c]);
        squares[c] = x * x;
    }
    float variance = aten_row_sum(squares, columns, lanes) / (float)columns;
    float scale = 1.0f / sqrtf(variance + eps);
    c = 0;
#ifdef __AVX512F__
    /* The same products and roundings 16 at once (a NaN comes out another NaN's bits). */
    __m512 scales = _mm512_set1_ps(scale);
    if (shifted)
        for (; c + 16 <= columns; c += 16) {
            __m512 normed = _mm512_mul_ps(widen16(h + c), scales);
            store16(o + c, round16(_mm512_mul_ps(normed, _mm512_loadu_ps(shifted + c))));
        }
    else
        for (; c + 16 <= columns; c += 16) {
            __m512 normed = round16(_mm512_mul_ps(widen16(h + c), scales));
            store16(o + c, round16(_mm512_mul_ps(widen16(weight + c), normed)));
        }
#endif
    if (shifted)
        for (; c < columns; ++c) o[c] = narrow((widen(h[c]) * scale) * shifted[c]);
    else
        for (; c < columns; ++c)
            o[c] = narrow(widen(weight[c]) * widen(narrow(widen(h[c]) * scale)));
}

/* hidden += delta (unless delta is NULL; Gemma's delta normed by `delta_shifted` first, unless
   that is NULL), then out = norm_row(hidden) by `weight` or `shifted`. Returns -1 when a row is
   wider than this file allows. */
static int norm_rows(bf16 *hidden, const bf16 *delta, const float *delta_shifted,
                     const bf16 *weight, const float *shifted, bf16 *out, long rows, long columns,
                     float eps, int lanes, int threads) {
    if (columns > MAX_COLUMNS || lanes > MAX_LANES) return -1;
#pragma omp parallel for num_threads(threads) if (rows * columns >= PARALLEL_MIN)
    for (long r = 0; r < rows; ++r) {
        bf16 *h = hidden + r * columns, normed[MAX_COLUMNS];
        float squares[MAX_COLUMNS];
        if (delta) {
            const bf16 *d = delta + r * columns;
            if (delta_shifted) {
                norm_row(d, NULL, delta_shifted, normed, columns, eps, lanes, squares);
                d = normed;
            }
            for (long c = 0; c < columns; ++c) h[c] = narrow(widen(h[c]) + widen(d[c]));
        }
        norm_row(h, weight, shifted, out + r * columns, columns, eps, lanes, squares);
    }
    return 0;
}

int add_rms_norm(bf16 *hidden, const bf16 *delta, const bf16 *weight, bf16 *out, long rows,
                 long columns, float eps, int lanes, int threads) {
    return norm_rows(hidden, delta, NULL, weight, NULL, out, rows, columns, eps, lanes, threads);
}

int add_gemma_norm(bf16 *hidden, const bf16 *delta, const float *delta_shifted,
                   const float *shifted, bf16 *out, long rows, long columns, float eps, int lanes,
                   int threads) {
    return norm_rows(hidden, delta, delta_shifted, NULL, shifted, out, rows, columns, eps, lanes,
                     threads);
}

/* The q/k norms before RoPE (Qwen 3, Gemma 3): each query head normed by `q`, each key head by
   `k`, as norm_row does (bfloat16 weights, or with `shifted` float32 1 + w). */
struct qk_norms {
    const void *q, *k;
    int shifted, lanes;
    float eps;
};

/* RoPE on each token's query and key heads, as transformers' apply_rotary_pos_emb computes it
   (q * cos + rotate_half(q) * sin, each product and the sum rounded to bfloat16), into out
   [tokens, heads + kv_heads, dim]; each head normed first where `norms` is given. qkv's row t
   starts at qkv + t * qkv_stride: heads query heads of dim, kv_heads key heads, then (with
   key_cache) kv_heads value heads. With key_cache, token t is decode row t: its key heads and
   value heads go to column pos[t] of its rows in the caches, laid out [rows, kv_heads, columns,
   dim]. */
static void rope_rows(const bf16 *qkv, long qkv_stride, long tokens, long heads, long kv_heads,
                      long dim, const struct qk_norms *norms, const bf16 *cos_table,
                      const bf16 *sin_table, const int64_t *pos, bf16 *out, bf16 *key_cache,
                      bf16 *value_cache, long columns, int threads) {
    long half = dim / 2, qk_heads = heads + kv_heads;
#pragma omp parallel for num_threads(threads) if (tokens * qk_heads * dim >= PARALLEL_MIN)
    for (long t = 0; t < tokens; ++t) {
        const bf16 *cos = cos_table + pos[t] * dim, *sin = sin_table + pos[t] * dim;
        const bf16 *row = qkv + t * qkv_stride;
        bf16 normed[MAX_HEAD];
        float squares[MAX_HEAD];
        for (long h = 0; h < qk_heads; ++h) {
            const bf16 *x = row + h * dim;
            bf16 *o = out + (t * qk_heads + h) * dim;
            if (norms) {
                const void *weight = h < heads ? norms->q : norms->k;
                norm_row(x, norms->shifted ? NULL : weight, norms->shifted ? weight : NULL,
                         normed, dim, norms->eps, norms->lanes, squares);
                x = normed;
            }
            for (long d = 0; d < half; ++d) {
                float straight = widen(narrow(widen(x[d]) * widen(cos[d])));
                float rotated = widen(narrow(-widen(x[d + half]) * widen(sin[d])));
                o[d] = narrow(straight + rotated);
            }
            for (long d = half; d < dim; ++d) {
                float straight = widen(narrow(widen(x[d]) * widen(cos[d])));
                float rotated = widen(narrow(widen(x[d - half]) * widen(sin[d])));
                o[d] = narrow(straight + rotated);
            }
        }
        if (key_cache)
            for (long h = 0; h < kv_heads; ++h) {
                long cell = ((t * kv_heads + h) * columns + pos[t]) * dim;
                memcpy(key_cache + cell, out + (t * qk_heads + heads + h) * dim, dim * sizeof(bf16));
                memcpy(value_cache + cell, row + (qk_heads + h) * dim, dim * sizeof(bf16));
            }
    }
}

/* rope_rows without norms over qk_heads heads, the last kv_heads of them keys (0: no cache). */
void rope(const bf16 *qkv, long qkv_stride, long tokens, long qk_heads, long dim,
          const bf16 *cos_table, const bf16 *sin_table, const int64_t *pos, bf16 *out,
          long kv_heads, bf16 *key_cache, bf16 *value_cache, long columns, int threads) {
    rope_rows(qkv, qkv_stride, tokens, qk_heads - kv_heads, kv_heads, dim, NULL, cos_table,
              sin_table, pos, out, key_cache, value_cache, columns, threads);
}

/* rope_rows with the q/k norms `q_norm` and `k_norm` (bfloat16 weights, or with `shifted` float32
   1 + w). Returns -1 when a head is wider than this file allows. */
int qk_norm_rope(const bf16 *qkv, long qkv_stride, long tokens, long heads, long kv_heads,
                 long dim, const void *q_norm, const void *k_norm, int shifted, float eps,
                 int lanes, const bf16 *cos_table, const bf16 *sin_table, const int64_t *pos,
                 bf16 *out, bf16 *key_cache, bf16 *value_cache, long columns, int threads) {
    if (dim > MAX_HEAD || lanes > MAX_LANES) return -1;
    struct qk_norms norms = {q_norm, k_norm, shifted, lanes, eps};
    rope_rows(qkv, qkv_stride, tokens, heads, kv_heads, dim, &norms, cos_table, sin_table, pos,
              out, key_cache, value_cache, columns, threads);
    return 0;
}

/* Each row's aten_row_sum, for the check that this machine's ATen sums in that order. */
void row_sums(const float *x, float *out, long rows, long columns, int lanes) {
    for (long r = 0; r < rows; ++r) out[r] = aten_row_sum(x + r * columns, columns, lanes);
}

/* act(gate) * up of the MLP, from one product of both: row r's gate is gate_up[r * stride ..],
   its up the `columns` values after it; out is [rows, columns], rows shared among `threads`.
   A bfloat16 gate has 65,536 values, so its activation (SiLU, or Gemma's GELU) is read from
   `silu_table`, PyTorch's own F.silu (F.gelu) of each of them indexed by its bits
   (fused_ops.py makes it, with one entry more: the vector gather reads 32 bits at each index).
   Looked up, it costs a fraction of computing it; ATen gives every value the same result on
   its vector and scalar paths (checked for all of them at start), so the table is its result
   wherever the value sits. The product is rounded to bfloat16 as ATen rounds it. */
void silu_mul(const bf16 *gate_up, long stride, bf16 *out, long rows, long columns,
              const bf16 *silu_table, int threads) {
#pragma omp parallel for num_threads(threads) if (rows * columns >= PARALLEL_MIN)
    for (long r = 0; r < rows; ++r) {
        const bf16 *gate = gate_up + r * stride, *up = gate + columns;
        bf16 *o = out + r * columns;
        long c = 0;
#ifdef __AVX512F__
        for (; c + 16 <= columns; c += 16) {
            __m512i bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(gate + c)));
            __m512i silu = _mm512_i32gather_epi32(bits, (const void *)silu_table, 2);
            __m512 wide = _mm512_castsi512_ps(_mm512_slli_epi32(silu, 16));  /* its own 16 bits */
            store16(o + c, round16(_mm512_mul_ps(wide, widen16(up + c))));
        }
#endif
        for (; c < columns; ++c) o[c] = narrow(widen(silu_table[gate[c]]) * widen(up[c]));
    }
}
