/* bfloat16 values as the engine's C passes read and write them (fused_ops.c,
   attention_kernel.c): widened to float32 exactly, rounded back to nearest even as
   c10::BFloat16 rounds. */
#ifndef TRITONBOX_BF16_H
#define TRITONBOX_BF16_H

#include <stdint.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

typedef uint16_t bf16;

static inline float widen(bf16 h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* float -> bfloat16, round to nearest even (c10::BFloat16's conversion). */
static inline bf16 narrow(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    u += ((u >> 16) & 1u) + 0x7fffu;
    return (bf16)(u >> 16);
}

#ifdef __AVX512F__
typedef __m512 (*exp16)(__m512);

static inline __m512 widen16(const bf16 *p) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

/* narrow() on 16 floats at once, NaN as ATen's vectors give it (0xffff). */
static inline __m512 round16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    u = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
    u = _mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u));
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(nan, u, _mm512_set1_epi32((int)0xffff0000u)));
}

static inline void store16(bf16 *p, __m512 rounded) {
    __m512i u = _mm512_srli_epi32(_mm512_castps_si512(rounded), 16);
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(u));
}

#endif

#endif
