/* The engine's compiled CPU kernels, float32 (built and loaded by cpu_kernels.py).

   llmlab_gemv_f32: y = b + x W for one row x and a weight stored input-major (W^T rows, row stride ld).
   llmlab_decode_f32: one decode step of one sequence through every decoder layer of a Llama-family
   model, in place on the residual row x: RMSNorm, the fused q/k/v GEMV (+ bias), RoPE with the caller's
   cos/sin, the new K/V written to the paged cache slot, attention over the sequence's keys read through
   its block table, the o GEMV, the residual, RMSNorm, the fused gate/up GEMV, SiLU(gate) * up, the down
   GEMV, the residual. The same arithmetic as the torch path (model_runner.py); sums run in a fixed order
   (no fast-math), so values differ from torch's by summation order only. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void llmlab_gemv_f32(const float *restrict x, const float *restrict w, const float *restrict b,
                     float *restrict y, ptrdiff_t in, ptrdiff_t out, ptrdiff_t ld) {
  /* Each weight row is read once, in memory order, into y (which stays in L1): the loop streams the
     weights at memory speed. Eight rows per pass; the vector runs along o. */
  for (ptrdiff_t o = 0; o < out; ++o) y[o] = b ? b[o] : 0.0f;
  ptrdiff_t i = 0;
  for (; i + 8 <= in; i += 8) {
    const float a0 = x[i], a1 = x[i + 1], a2 = x[i + 2], a3 = x[i + 3];
    const float a4 = x[i + 4], a5 = x[i + 5], a6 = x[i + 6], a7 = x[i + 7];
    const float *r = w + i * ld;
    for (ptrdiff_t o = 0; o < out; ++o)
      y[o] = y[o] + a0 * r[o] + a1 * r[ld + o] + a2 * r[2 * ld + o] + a3 * r[3 * ld + o]
                  + a4 * r[4 * ld + o] + a5 * r[5 * ld + o] + a6 * r[6 * ld + o] + a7 * r[7 * ld + o];
  }
  for (; i < in; ++i) {
    const float a = x[i], *r = w + i * ld;
    for (ptrdiff_t o = 0; o < out; ++o) y[o] += a * r[o];
  }
}

typedef struct {
  const float *input_norm, *post_norm;          /* (hidden,) */
  const float *qkv, *qkv_bias; ptrdiff_t qkv_ld;  /* W^T (hidden, (heads + 2 kv_heads) head_dim); bias or NULL */
  const float *o, *o_bias; ptrdiff_t o_ld;        /* W^T (heads head_dim, hidden) */
  const float *gate_up, *gate_up_bias; ptrdiff_t gate_up_ld;  /* W^T (hidden, 2 intermediate): gate, then up */
  const float *down, *down_bias; ptrdiff_t down_ld;           /* W^T (intermediate, hidden) */
  float *k_cache, *v_cache;                     /* (slots, kv_heads, head_dim), contiguous */
} llmlab_layer;

typedef struct {
  ptrdiff_t hidden, heads, kv_heads, head_dim, intermediate, block_size;
  float eps, scale;
} llmlab_dims;

static void rms_norm(const float *x, const float *w, float *y, ptrdiff_t n, float eps) {
  double ss = 0.0;
  for (ptrdiff_t i = 0; i < n; ++i) ss += (double)x[i] * x[i];
  const float r = 1.0f / sqrtf((float)(ss / (double)n) + eps);
  for (ptrdiff_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

/* x * cos + rotate_half(x) * sin over one head of d values (HF's apply_rotary_pos_emb). */
static void rope(float *x, const float *cos, const float *sin, ptrdiff_t d) {
  const ptrdiff_t h = d / 2;
  for (ptrdiff_t i = 0; i < h; ++i) {
    const float a = x[i], b = x[i + h];
    x[i] = a * cos[i] - b * sin[i];
    x[i + h] = b * cos[i + h] + a * sin[i + h];
  }
}

static float dot(const float *a, const float *b, ptrdiff_t n) {
  float acc[8] = {0};
  ptrdiff_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

/* One query row against nkeys keys of the paged cache: softmax(q k^T * scale) v per query head;
   query head h reads KV head h / (heads / kv_heads) (GQA). */
static void attend(const float *q, const llmlab_layer *l, const llmlab_dims *d, const int64_t *table,
                   ptrdiff_t nkeys, float *out, float *p) {
  const ptrdiff_t D = d->head_dim, B = d->block_size, row = d->kv_heads * D, group = d->heads / d->kv_heads;
  for (ptrdiff_t h = 0; h < d->heads; ++h) {
    const float *qh = q + h * D;
    const ptrdiff_t kvh = (h / group) * D;
    float m = -INFINITY;
    for (ptrdiff_t t = 0; t < nkeys; ++t) {
      const ptrdiff_t slot = table[t / B] * B + t % B;
      p[t] = dot(qh, l->k_cache + slot * row + kvh, D) * d->scale;
      if (p[t] > m) m = p[t];
    }
    double sum = 0.0;
    for (ptrdiff_t t = 0; t < nkeys; ++t) {
      p[t] = expf(p[t] - m);
      sum += p[t];
    }
    float *oh = out + h * D;
    memset(oh, 0, (size_t)D * sizeof(float));
    for (ptrdiff_t t = 0; t < nkeys; ++t) {
      const float *v = l->v_cache + (table[t / B] * B + t % B) * row + kvh, pt = p[t];
      for (ptrdiff_t i = 0; i < D; ++i) oh[i] += pt * v[i];
    }
    const float inv = (float)(1.0 / sum);
    for (ptrdiff_t i = 0; i < D; ++i) oh[i] *= inv;
  }
}

/* x (hidden,) in place; cos/sin (head_dim,) for the new token's position; table: the sequence's block
   table; nkeys: its keys with the new token's; slot: where the new token's K/V go. 0, or -1 if out of memory. */
int llmlab_decode_f32(float *restrict x, const llmlab_layer *layers, ptrdiff_t n_layers, const llmlab_dims *d,
                      const float *cos, const float *sin, const int64_t *table, ptrdiff_t nkeys, ptrdiff_t slot) {
  const ptrdiff_t H = d->hidden, D = d->head_dim, I = d->intermediate;
  const ptrdiff_t nq = d->heads * D, nkv = d->kv_heads * D;
  float *buf = malloc(sizeof(float) * (size_t)(H + nq + 2 * nkv + nq + 2 * I + H + nkeys));
  if (!buf) return -1;
  float *h = buf, *qkv = h + H, *att = qkv + nq + 2 * nkv, *gu = att + nq, *y = gu + 2 * I, *p = y + H;
  for (ptrdiff_t li = 0; li < n_layers; ++li) {
    const llmlab_layer *l = layers + li;
    rms_norm(x, l->input_norm, h, H, d->eps);
    llmlab_gemv_f32(h, l->qkv, l->qkv_bias, qkv, H, nq + 2 * nkv, l->qkv_ld);
    float *q = qkv, *k = qkv + nq, *v = k + nkv;
    for (ptrdiff_t i = 0; i < d->heads; ++i) rope(q + i * D, cos, sin, D);
    for (ptrdiff_t i = 0; i < d->kv_heads; ++i) rope(k + i * D, cos, sin, D);
    memcpy(l->k_cache + slot * nkv, k, (size_t)nkv * sizeof(float));
    memcpy(l->v_cache + slot * nkv, v, (size_t)nkv * sizeof(float));
    attend(q, l, d, table, nkeys, att, p);
    llmlab_gemv_f32(att, l->o, l->o_bias, y, nq, H, l->o_ld);
    for (ptrdiff_t i = 0; i < H; ++i) x[i] += y[i];
    rms_norm(x, l->post_norm, h, H, d->eps);
    llmlab_gemv_f32(h, l->gate_up, l->gate_up_bias, gu, H, 2 * I, l->gate_up_ld);
    for (ptrdiff_t i = 0; i < I; ++i) {
      const float g = gu[i];
      gu[i] = g / (1.0f + expf(-g)) * gu[I + i];
    }
    llmlab_gemv_f32(gu, l->down, l->down_bias, y, I, H, l->down_ld);
    for (ptrdiff_t i = 0; i < H; ++i) x[i] += y[i];
  }
  free(buf);
  return 0;
}
