/* The engine's attention, each row over its own keys only: a decode step's (one query per head
   and row) and a prompt's (causal: the query at position t of `positions` over the keys up to
   its own).

   Each (row, kv head, block of a prompt's positions) is one task on one thread: for each query
   position, the scores of the head's query group against the keys it sees in float32 (products
   summed over the head dimension in a fixed order, then scaled), their softmax in float32
   (Sleef's exp, as ATen's), the weighted sum of the values in float32, and one rounding of each
   output to bfloat16. A block's positions share each key's and value's widening (attend()),
   with each position's sums the same operations in the same order as alone. A sliding window
   (`window` > 0) starts a query's keys `window` before its own position; a soft cap
   (`softcap` > 0) takes each scaled score s to cap · tanh(s / cap) before the softmax
   (Gemma 2), in float32 as windowed.py computes them. Nothing in a row's result
   depends on its neighbours, on how many columns the batch is padded to or on the thread
   count, so a row's bits are its own by construction, alone or in any batch (attention.py says
   why the engine needs that, and attention_kernel.py checks it at start). Returns nonzero
   without AVX-512 or for a head dimension or group this build does not take. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "bf16.h"

#define MAX_GROUPS 8
#define MAX_CHUNKS 16 /* head dimension up to 256 (Gemma 3), in vectors of 16 */
#define STACK_SCORES 8192 /* a task's scores up to this many floats on its stack, else malloc'd */

#ifdef __AVX512F__
/* Lane i of the result: the sum of a[i]'s 16 lanes (a tree of pairwise additions). */
static inline __m512 lane_sums(const __m512 *a) {
    __m512 z[4];
    for (int m = 0; m < 4; m++) {
        const __m512 *b = a + 4 * m;
        __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(b[0], b[1]), _mm512_unpackhi_ps(b[0], b[1]));
        __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(b[2], b[3]), _mm512_unpackhi_ps(b[2], b[3]));
        __m512d xd = _mm512_castps_pd(x), yd = _mm512_castps_pd(y);
        z[m] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(xd, yd)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(xd, yd)));
    }
    __m512 u0 = _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xdd));
    __m512 u1 = _mm512_add_ps(_mm512_shuffle_f32x4(z[2], z[3], 0x88), _mm512_shuffle_f32x4(z[2], z[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(u0, u1, 0x88), _mm512_shuffle_f32x4(u0, u1, 0xdd));
}

/* The 16 lanes of q · k, head dimension `chunks` × 16, unsummed. */
static inline __m512 products(const __m512 *q, const __m512 *k, int chunks) {
    __m512 sum = _mm512_mul_ps(q[0], k[0]);
    for (int c = 1; c < chunks; c++) sum = _mm512_fmadd_ps(q[c], k[c], sum);
    return sum;
}

/* Where one (row, kv head)'s keys and values are: column j at keys + j * key_column. */
typedef struct {
    const bf16 *keys, *values;
    long key_column, value_column;
} Columns;

#define JOINT 4 /* a prompt's positions attended side by side, at most */
#define ALWAYS static inline __attribute__((always_inline))

/* `queries` query groups' (`groups` heads each, `q[n * MAX_GROUPS + g]`) scaled scores against
   columns [from, whole) of kv, whole blocks of 16 from `from` (a multiple of 16): group n's
   scores from scores + n * groups * padded. Each score is one query's products summed by
   lane_sums, whichever of the queries are computed beside it. */
ALWAYS void score_blocks(__m512 (*q)[MAX_CHUNKS], int queries, Columns kv, long from, long whole,
                         long groups, int chunks, float scale, float *scores, long padded) {
    const __m512 vscale = _mm512_set1_ps(scale);
    __m512 k[MAX_CHUNKS];
    for (long j0 = from; j0 < whole; j0 += 16) {
        __m512 part[JOINT * MAX_GROUPS][16];
        for (int j = 0; j < 16; j++) {
            const bf16 *key = kv.keys + (j0 + j) * kv.key_column;
            /* Ahead of use: this column's values, read after the softmax, into L2 (into L1 they
               pushed out the keys and scores in use: a decode step's attention took a fifth
               longer), and the keys 32 columns on (16 were too few to cover memory's latency). */
            for (int c = 0; c < chunks; c += 2) {
                _mm_prefetch((const char *)(kv.values + (j0 + j) * kv.value_column + 16 * c), _MM_HINT_T1);
                _mm_prefetch((const char *)(key + 32 * kv.key_column + 16 * c), _MM_HINT_T0);
            }
            for (int c = 0; c < chunks; c++) k[c] = widen16(key + 16 * c);
            for (int n = 0; n < queries; n++)
                for (long g = 0; g < groups; g++)
                    part[n * groups + g][j] = products(q[n * MAX_GROUPS + g], k, chunks);
        }
        for (int n = 0; n < queries; n++)
            for (long g = 0; g < groups; g++)
                _mm512_store_ps(scores + (n * groups + g) * padded + j0,
                                _mm512_mul_ps(lane_sums(part[n * groups + g]), vscale));
    }
}

/* One query group's scores against columns [from, length): whole blocks, then one by one. */
ALWAYS void score_rest(__m512 (*q)[MAX_CHUNKS], Columns kv, long from, long length, long groups,
                       int chunks, float scale, float *scores, long padded) {
    long whole = length & ~15L;
    score_blocks(q, 1, kv, from, whole, groups, chunks, scale, scores, padded);
    __m512 k[MAX_CHUNKS];
    for (long j = whole; j < length; j++) {
        for (int c = 0; c < chunks; c++) k[c] = widen16(kv.keys + j * kv.key_column + 16 * c);
        for (long g = 0; g < groups; g++)
            scores[g * padded + j] = _mm512_reduce_add_ps(products(q[g], k, chunks)) * scale;
    }
}

/* Softcap, then each group's softmax numerators in place (past `length`: 0); sums in totals. */
ALWAYS void exponentiate(float *scores, long length, long groups, long padded, float softcap,
                         exp16 vexp, float *totals) {
    if (softcap > 0.f)
        for (long g = 0; g < groups; g++)
            for (long j = 0; j < length; j++) {
                float *s = scores + g * padded + j;
                *s = tanhf(*s / softcap) * softcap;
            }
    long end = (length + 15) & ~15L; /* past it only a longer position's columns, or none */
    for (long g = 0; g < groups; g++) {
        float *row = scores + g * padded;
        for (long j = length; j < end; j++) row[j] = -INFINITY;
        /* The largest score, 16 lanes at a time (a maximum is exact in any order): a scalar
           running maximum is a chain of dependent compares, a third of a long prompt's
           attention. */
        __m512 top = _mm512_set1_ps(-INFINITY);
        for (long j = 0; j < end; j += 16) top = _mm512_max_ps(_mm512_load_ps(row + j), top);
        __m512 shift = _mm512_set1_ps(_mm512_reduce_max_ps(top)), sum = _mm512_setzero_ps();
        for (long j = 0; j < end; j += 16) {
            __m512 e = vexp(_mm512_sub_ps(_mm512_load_ps(row + j), shift));
            _mm512_store_ps(row + j, e);
            sum = _mm512_add_ps(sum, e);
        }
        totals[g] = _mm512_reduce_add_ps(sum);
    }
}

/* One or two query groups' (`pair`, a constant where inlined) weighted sums of the values, the
   second seeing one column more, each summed in column order; out[n] rounded once. */
ALWAYS void weigh_values(const float *scores, const int pair, Columns kv, long length,
                         long groups, int chunks, const float *totals, bf16 *const *out,
                         long padded, const bf16 *ahead) {
    long dim = 16L * chunks, stride = groups * padded;
    __m512 acc[2][MAX_GROUPS][MAX_CHUNKS], v[MAX_CHUNKS];
    for (int n = 0; n < pair; n++)
        for (long g = 0; g < groups; g++)
            for (int c = 0; c < chunks; c++) acc[n][g][c] = _mm512_setzero_ps();
    for (long j = 0; j < length + pair - 1; j++) {
        for (int c = 0; c < chunks; c += 2)
            _mm_prefetch((const char *)(ahead + j * kv.key_column + 16 * c), _MM_HINT_T1); /* L2: as above */
        for (int c = 0; c < chunks; c++) v[c] = widen16(kv.values + j * kv.value_column + 16 * c);
        int last = j == length; /* the second's last column, not the first's */
        for (int n = 0; n < pair; n++)
            for (long g = 0; g < groups; g++) {
                __m512 weight = _mm512_set1_ps(scores[n * stride + g * padded + j]);
                if (!(n == 0 && last))
                    for (int c = 0; c < chunks; c++)
                        acc[n][g][c] = _mm512_fmadd_ps(weight, v[c], acc[n][g][c]);
            }
    }
    for (int n = 0; n < pair; n++)
        for (long g = 0; g < groups; g++) {
            __m512 total = _mm512_set1_ps(totals[n * MAX_GROUPS + g]);
            for (int c = 0; c < chunks; c++)
                store16(out[n] + g * dim + 16 * c, round16(_mm512_div_ps(acc[n][g][c], total)));
        }
}

/* `count` (≤ JOINT) consecutive query positions of one group (heads contiguous, positions
   `query_step` apart; outputs `out_step` apart), the first over the first `length` columns and
   each next over one more. A position's bits are those it has computed alone: the columns all
   of them see in whole blocks are scored together, each key widened once for all; the rest as
   alone; the values summed two positions at a time. `scores`: count × groups × padded floats;
   `ahead`: where to prefetch the next task's keys from. */
ALWAYS void attend(const bf16 *query, long query_step, int count, Columns kv, long length,
                   bf16 *out, long out_step, long groups, int chunks, float scale,
                   float softcap, exp16 vexp, float *scores, long padded, const bf16 *ahead) {
    long dim = 16L * chunks, shared = count > 1 ? length & ~15L : 0, stride = groups * padded;
    __m512 q[JOINT * MAX_GROUPS][MAX_CHUNKS];
    float totals[JOINT * MAX_GROUPS];
    for (int n = 0; n < count; n++)
        for (long g = 0; g < groups; g++)
            for (int c = 0; c < chunks; c++)
                q[n * MAX_GROUPS + g][c] = widen16(query + n * query_step + g * dim + 16 * c);
    if (count == JOINT) /* a constant for the compiler */
        score_blocks(q, JOINT, kv, 0, shared, groups, chunks, scale, scores, padded);
    else
        score_blocks(q, count, kv, 0, shared, groups, chunks, scale, scores, padded);
    for (int n = 0; n < count; n++) {
        score_rest(q + n * MAX_GROUPS, kv, shared, length + n, groups, chunks, scale,
                   scores + n * stride, padded);
        exponentiate(scores + n * stride, length + n, groups, padded, softcap, vexp,
                     totals + n * MAX_GROUPS);
    }
    for (int n = 0; n < count; n += 2) {
        bf16 *const outs[2] = {out + n * out_step, out + (n + 1) * out_step};
        if (count - n > 1)
            weigh_values(scores + n * stride, 2, kv, length + n, groups, chunks,
                         totals + n * MAX_GROUPS, outs, padded, ahead);
        else
            weigh_values(scores + n * stride, 1, kv, length + n, groups, chunks,
                         totals + n * MAX_GROUPS, outs, padded, ahead);
    }
}

/* A decode step's tasks (row × kv_heads + head) shared out among `threads` by their rows'
   keys, the longest first, each to the thread with the least so far (rows' lengths differ
   tenfold on mixed traffic, and an even count of tasks each left one thread waiting on the
   other): thread t runs plan[start[t] .. start[t + 1]), in that order. `plan`: room for
   3 × tasks + threads + 1. */
static void share_out(const int64_t *lengths, long rows, long kv_heads, int threads, long *plan,
                      long *start) {
    long tasks = rows * kv_heads, *order = plan + tasks + threads + 1, *owner = order + rows;
    long load[256] = {0};
    for (long r = 0; r < rows; r++) order[r] = r;
    for (long i = 1; i < rows; i++) /* longest first; ties by row, so the plan is fixed */
        for (long j = i; j > 0 && lengths[order[j]] > lengths[order[j - 1]]; j--) {
            long t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    long used = threads < 256 ? threads : 256;
    for (long i = 0; i < tasks; i++) {
        long least = 0;
        for (long t = 1; t < used; t++)
            if (load[t] < load[least]) least = t;
        owner[i] = least;
        load[least] += lengths[order[i / kv_heads]] + 16; /* + a task's fixed cost */
    }
    long at = 0;
    for (int t = 0; t <= threads; t++) {
        start[t] = at;
        for (long i = 0; t < threads && i < tasks; i++)
            if (owner[i] == t) plan[at++] = order[i / kv_heads] * kv_heads + i % kv_heads;
    }
}

/* A prompt's positions are cut into blocks of this many, each block a task of its own: a lone
   prompt (or a chunk of one) has as few (row, kv head) tasks as kv heads (3 for SmolLM2), which
   left one of two threads idle for a third of its attention. A position's result does not
   depend on which task computes it; a block's positions are attended side by side. */
#define POSITION_BLOCK JOINT

typedef struct {
    const bf16 *query, *keys, *values;
    long query_row, query_position, key_row, key_head, key_column, value_row, value_head,
        value_column;
    const int64_t *lengths;
    long positions, rows, kv_heads, groups, dim, window, blocks;
    bf16 *out;
    float scale, softcap;
    exp16 vexp;
} Attention;

/* Task `task`: (row, kv head) task % (rows × kv heads), its positions' block counted from the
   last (the costliest first, for the dynamic schedule); `after`: the task whose keys to fetch
   ahead. Nonzero when it could not run. */
static int run_task(const Attention *a, long task, long after) {
    long pair = task % (a->rows * a->kv_heads), block = a->blocks - 1 - task / (a->rows * a->kv_heads);
    long row = pair / a->kv_heads, head = pair % a->kv_heads, longest = a->lengths[row];
    long padded = (longest + 15) & ~15L, first = longest - a->positions + 1, groups = a->groups;
    long dim = a->dim, begin = block * POSITION_BLOCK;
    long end = begin + POSITION_BLOCK < a->positions ? begin + POSITION_BLOCK : a->positions;
    int chunks = (int)(dim / 16);
    /* A block its window does not cut into (its last position sees from column 0) is attended
       as one; else position by position, each from its window's start. */
    int joint = a->window <= 0 || first + end - 1 <= a->window;
    int count = joint ? (int)(end - begin) : 1, small = count * groups * padded <= STACK_SCORES;
    float on_stack[STACK_SCORES] __attribute__((aligned(64)));
    float *scores = small ? on_stack : aligned_alloc(64, sizeof(float) * (size_t)(count * groups * padded));
    if (!scores || first < 1) {
        if (!small) free(scores);
        return 1;
    }
    Columns kv = {a->keys + row * a->key_row + head * a->key_head,
                  a->values + row * a->value_row + head * a->value_head, a->key_column,
                  a->value_column};
    long after_pair = after % (a->rows * a->kv_heads), out_step = a->kv_heads * groups * dim;
    const bf16 *ahead = a->keys + (after_pair / a->kv_heads) * a->key_row +
                        (after_pair % a->kv_heads) * a->key_head;
    for (long t = begin; t < end; t += count) {
        const bf16 *q = a->query + row * a->query_row + t * a->query_position + head * groups * dim;
        bf16 *o = a->out + (row * a->positions + t) * out_step + head * groups * dim;
        const bf16 *next = t + count < end ? kv.keys : ahead;
        long seen = first + t, start = a->window > 0 && seen > a->window ? seen - a->window : 0;
        Columns in = {kv.keys + start * a->key_column, kv.values + start * a->value_column,
                      a->key_column, a->value_column};
        if (chunks == 4 && groups == 3) /* SmolLM2's heads, unrolled by the compiler */
            attend(q, a->query_position, count, in, seen - start, o, out_step, 3, 4,
                   a->scale, a->softcap, a->vexp, scores, padded, next);
        else if (chunks == 4) /* the common head dimension of 64, unrolled by the compiler */
            attend(q, a->query_position, count, in, seen - start, o, out_step, groups, 4,
                   a->scale, a->softcap, a->vexp, scores, padded, next);
        else
            attend(q, a->query_position, count, in, seen - start, o, out_step, groups, chunks,
                   a->scale, a->softcap, a->vexp, scores, padded, next);
    }
    if (!small) free(scores);
    return 0;
}
#endif

/* query (row r, position t): its heads at query[r * query_row + t * query_position ..],
   [kv heads × groups, dim] contiguous. keys (row r, kv head h, column j) at
   keys[r * key_row + h * key_head + j * key_column ..], dim contiguous; values likewise. Row r's
   query at position t (of `positions`) sees its first lengths[r] - positions + 1 + t columns: a
   decode step's one query all of a row's keys, a prompt's causally; of those, the last
   `window` only where window > 0. out: [rows, positions, kv heads × groups, dim]
   contiguous. */
int attention(const bf16 *query, long query_row, long query_position, const bf16 *keys,
              long key_row, long key_head, long key_column, const bf16 *values, long value_row,
              long value_head, long value_column, const int64_t *lengths, long positions,
              bf16 *out, long rows, long kv_heads, long groups, long dim, float scale,
              long window, float softcap, void *vector_exp, int threads) {
#ifdef __AVX512F__
    if (!vector_exp || dim % 16 || dim / 16 > MAX_CHUNKS || groups < 1 || groups > MAX_GROUPS)
        return -1;
    Attention a = {query, keys, values, query_row, query_position, key_row, key_head,
                   key_column, value_row, value_head, value_column, lengths, positions, rows,
                   kv_heads, groups, dim, window, (positions + POSITION_BLOCK - 1) / POSITION_BLOCK,
                   out, scale, softcap, (exp16)vector_exp};
    long tasks = rows * kv_heads * a.blocks;
    int failed = 0;
    if (a.blocks == 1) { /* a decode step: one task per (row, kv head), costing its row's keys */
        long *plan = malloc(sizeof(long) * (size_t)(3 * tasks + threads + 1));
        if (!plan) return -2;
        long *start = plan + tasks;
        share_out(lengths, rows, kv_heads, threads, plan, start);
#pragma omp parallel num_threads(threads) reduction(| : failed)
        {
            long me = omp_get_thread_num(), first = start[me], end = start[me + 1];
            for (long i = first; i < end; i++)
                failed |= run_task(&a, plan[i], plan[i + 1 < end ? i + 1 : i]);
        }
        free(plan);
    } else { /* a prompt's blocks: later positions see more keys */
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) reduction(| : failed)
        for (long task = 0; task < tasks; task++)
            failed |= run_task(&a, task, task + 1 < tasks ? task + 1 : task);
    }
    return failed;
#else
    (void)query; (void)query_row; (void)query_position; (void)keys; (void)key_row;
    (void)key_head; (void)key_column; (void)values; (void)value_row; (void)value_head;
    (void)value_column; (void)lengths; (void)positions; (void)out; (void)rows; (void)kv_heads;
    (void)groups; (void)dim; (void)scale; (void)window; (void)softcap; (void)vector_exp;
    (void)threads;
    return -1;
#endif
}
