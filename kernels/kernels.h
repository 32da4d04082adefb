/* kernels.h — every tensor operation the engine uses, for two devices.
 *
 * This is the only interface between model code (engine/) and a device.
 * Each operation is declared once, in the X-macro list of kn_ops.h; the
 * kn_* prototypes below, the device table (kn_backend) and the dispatch in
 * kernels.c are all generated from that list. A device implements every
 * op with the semantics documented here: kernels/cpu (C, its own thread
 * pool, oneDNN / OpenBLAS sgemm) today, kernels/cuda (CUDA C, cuBLASLt,
 * fp32 accumulation) next.
 *
 * Conventions (llm.c style: raw pointers plus sizes, shapes in comments):
 *  - Ops compute in fp32 (wider where they reduce). 16-bit storage enters
 *    through the ops that take a kn_dtype: a `void *` tensor argument holds
 *    the dtype the op is given for it (every activation op: add, embedding,
 *    norms, RoPE forward, attention, GELU, SwiGLU, dropout, matmul16's x,
 *    out, dout, cross-entropy's logits; convert, round); a 16-bit store
 *    rounds to nearest even once. Every `float *` argument is fp32:
 *    gradients, norm weights, statistics (mean, rstd, lse).
 *  - Tensors are row-major, contiguous unless a leading dimension
 *    (`ld*`, in elements) is given. Pointers are device pointers obtained
 *    from kn_alloc on the same context.
 *  - Linear weights are stored as nn.Linear does: w[out, in]; y = x w^T + b.
 *    (GPT-2's Conv1D [in, out] weights are transposed at load and export.)
 *  - Every *_bwd ACCUMULATES (+=) into each gradient it writes, so gradient
 *    accumulation and residual branches need no extra adds; callers zero
 *    gradient buffers with kn_zero (or let kn_adamw_blocks clear them). The one exception is documented
 *    (kn_crossentropy_bwd overwrites dlogits). A NULL gradient pointer means
 *    "not needed" (frozen weights, inputs without grad) and is skipped.
 *  - Results are deterministic for a given thread count: no atomics on
 *    floats, static work partitioning, fixed reduction order. Exact resume
 *    depends on this.
 *  - Reductions that return a number to the host (kn_sumsq, kn_sum) use a
 *    double accumulator.
 *  - Errors: an op cannot return one (a device queues work), so a failure
 *    inside an op (scratch allocation, a device error) is recorded in the
 *    context; the first one sticks and later ops do nothing until the
 *    caller collects it with kn_check (the engine does once per step and
 *    stops with an `error` event). Library code never exits. */
#ifndef TY_KERNELS_H
#define TY_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include "tyerr.h"

typedef enum { KN_CPU = 0, KN_CUDA = 1 } kn_device;

/* Element types of stored tensors. Arithmetic is always fp32 (reductions
 * wider); KN_BF16 / KN_F16 are storage formats, converted with
 * round-to-nearest-even (fp16 overflows to inf, NaN stays NaN). */
typedef enum { KN_F32 = 0, KN_BF16 = 1, KN_F16 = 2 } kn_dtype;
size_t kn_dtype_size(kn_dtype dt);      /* 4 or 2 */
const char *kn_dtype_name(kn_dtype dt); /* "fp32" | "bf16" | "fp16" */

typedef struct kn_ctx kn_ctx;

/* A weight w[M, K] quantised to 4-bit NormalFloat in bitsandbytes' layout
 * (engine/nf4.c quantises at load; docs/kernels.md "NF4"). Its n = M * K
 * elements, row-major, form blocks of KN_NF4_BLOCK; element i is
 *   kn_nf4_levels[q(i)] * absmax(i / 64)
 * with q(i) the high nibble of codes[i / 2] for even i, the low nibble for
 * odd i. absmax(b) is absmax[b] (fp32), or with double quantisation
 * (absmax == NULL) kn_dyn8_map[qabsmax[b]] * absmax2[b / 256] + offset, in
 * that order of fp32 operations (bitsandbytes' dequantize_blockwise, then
 * the offset). All pointers are device memory; the struct goes by value.
 * A view of part of a quantised tensor (a row block of Phi-3's fused
 * qkv_proj / gate_up_proj) keeps the whole tensor's pointers and sets
 * `first`: its element i is the tensor's element first + i, so blocks and
 * the double quantisation's groups of 256 are the whole tensor's, as
 * bitsandbytes quantised it, wherever the view starts. */
typedef struct kn_nf4 {
    const uint8_t *codes;   /* [ceil(n / 2)] */
    const float *absmax;    /* [ceil(n / 64)], or NULL when double-quantised */
    const uint8_t *qabsmax; /* [ceil(n / 64)] codes of absmax - offset */
    const float *absmax2;   /* [ceil(ceil(n / 64) / 256)] */
    float offset;           /* mean of the fp32 absmax values */
    size_t first;           /* a view's first element in the tensor (0: the tensor) */
} kn_nf4;
#define KN_NF4_BLOCK 64
#define KN_NF4_BLOCK2 256
/* The 16 NF4 levels and bitsandbytes' signed dynamic 8-bit map
 * (create_dynamic_map(signed=True), sorted), as fp32: kernels/nf4_tables.h. */
extern const float kn_nf4_levels[16];
extern const float kn_dyn8_map[256];

/* One piece of kn_convert_spans: n elements from element src of the
 * source to element dst of the destination (each counted in its own
 * buffer's type). */
typedef struct kn_span {
    size_t dst, src, n;
} kn_span;

/* One tensor of a fused AdamW update (kn_adamw_blocks): the parameter as
 * kn_adamw takes it (pdt KN_F32: fp32 p, plo NULL; KN_BF16: a split
 * master's hi / lo), its gradient and moments, n elements, weight decay. */
typedef struct kn_adamw_block {
    void *p;
    uint16_t *plo;
    float *g, *m, *v;
    size_t n;
    float wd;
    kn_dtype pdt;
} kn_adamw_block;
/* What every block of one update shares: torch.optim.AdamW's settings and
 * step t (from 1), the gradient's two factors (the update reads
 * (g * gscale[0]) * gscale[1], two fp32 multiplies in that order: the
 * loss-scale's reciprocal, then the clip coefficient) and zero_grad (1:
 * each gradient is set to 0 once read, ready for the next step). */
typedef struct kn_adamw_hp {
    float lr, b1, b2, eps;
    int64_t t;
    float gscale[2];
    int zero_grad;
} kn_adamw_hp;

/* ---- context and memory ---------------------------------------------- */

/* Opens a context on a device (device_index: GPU ordinal, ignored on CPU).
 * KN_CUDA returns TY_EINVAL with a clear message when the build has no CUDA
 * or no GPU is present. n_threads: CPU threads (0 = OpenMP default). */
int kn_open(kn_ctx **out, kn_device dev, int device_index, int n_threads, ty_err *err);
void kn_close(kn_ctx *c);
kn_device kn_device_of(const kn_ctx *c);
const char *kn_device_name(const kn_ctx *c); /* "cpu" | "cuda" */
/* One line for logs: device, library and threads, e.g.
 * "cpu: openblas SkylakeX, 2 threads". Owned by the context. */
const char *kn_describe(const kn_ctx *c);

/* What the context runs on, for the engine's `started` event. On the CPU
 * only name is set ("cpu"); on CUDA: the card's name and memory, its
 * compute capability, and the driver and runtime versions in CUDA's
 * encoding (1000 * major + 10 * minor; 0 = unknown). */
typedef struct kn_device_info {
    char name[128];
    size_t total_mem;
    int cc_major, cc_minor;
    int driver_version, runtime_version;
} kn_device_info;
const kn_device_info *kn_info(const kn_ctx *c);

/* Host memory for buffers copied to the device every step (the engine's
 * batches): page-locked on CUDA, so kn_to_device is a real asynchronous
 * copy; plain malloc on the CPU. The host must not change it until the
 * next read-back (kn_to_host, a value op) or kn_sync. kn_host_free takes
 * what kn_host_alloc gave (NULL ctx: plain free, for buffers a caller
 * malloc'd before any context existed). */
void *kn_host_alloc(kn_ctx *c, size_t bytes);
void kn_host_free(kn_ctx *c, void *p);

/* Zero-initialised device memory, 64-byte aligned. NULL on failure.
 * kn_free ignores NULL and pointers this context did not allocate;
 * kn_close frees whatever the context still holds. */
void *kn_alloc(kn_ctx *c, size_t bytes);
void kn_free(kn_ctx *c, void *p);
/* Bytes currently / at most allocated through this context. */
size_t kn_bytes_in_use(const kn_ctx *c);
size_t kn_peak_bytes(const kn_ctx *c);
/* Bytes in use on the whole device right now, as the driver sees it
 * (cudaMemGetInfo's total - free): the context's buffers plus what it
 * does not account for, the CUDA context itself, cuBLASLt's own
 * allocations and any other process on the card. 0 on the CPU, or when
 * the device cannot say. */
size_t kn_device_used_bytes(kn_ctx *c);
/* Rows (1..N) of the [N, V] logits, es bytes an element, that the loss
 * head computes at once on this device (docs/engine.md, "The loss head").
 * CPU: 32 MiB of logits (at least 128 rows): a chunk stays near the
 * caches and its GEMMs still have hundreds of rows. CUDA: all N rows when
 * they fit the logit budget, the smaller of 1 GiB and 1/64 of the card's
 * memory (kn_info's total, so the choice is the same run after run and a
 * resumed run chunks as the first did; small cards keep their memory for
 * the activations); else the most rows the
 * budget holds in multiples of 128 (whole tensor-core tiles), at least
 * 128. */
int kn_logit_rows(kn_ctx *c, size_t N, size_t V, size_t es);
/* The leading dimension (>= V) the loss head gives its [rows, V] logits
 * (kn_logits_*, kn_crossentropy_*): V on the CPU; on CUDA V rounded up to
 * a multiple of 128, so every row starts 16-byte aligned and the GEMMs'
 * output has whole tiles of columns. Pass it to kn_logit_rows as V. */
int kn_logit_ld(kn_ctx *c, int V);
void kn_to_device(kn_ctx *c, void *dst, const void *host_src, size_t bytes);
void kn_to_host(kn_ctx *c, void *host_dst, const void *src, size_t bytes);
/* Waits for queued device work (no-op on CPU). */
void kn_sync(kn_ctx *c);

/* ---- error channel ---------------------------------------------------- */

/* Records a failure inside an op (kernels and backends call this; the
 * first failure wins). Safe to call from outside parallel jobs only. */
void kn_fail(kn_ctx *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Returns 0, or the recorded failure's TY_E* code with its message in err,
 * and clears it so the context can be used again. */
int kn_check(kn_ctx *c, ty_err *err);

/* ---- operations (generated from kn_ops.h) ------------------------------ */

#include "kn_ops.h"

#define KN_PROTO(ret, name, params, args) ret kn_##name params;
KN_OPS(KN_PROTO)
#undef KN_PROTO

/* What each op does (shapes in elements; see also docs/kernels.md):
 *
 * Elementwise: kn_zero, kn_copy, kn_scale (x *= s), kn_axpy (y += a x),
 * kn_add (out = a + b); kn_sum and kn_sumsq return a double (the global
 * grad norm); kn_nonfinite is 1 if any element is NaN or inf.
 * kn_sumsq_scaled: the sum of squares of (float)(x[i] * s), the fp32
 *   product widened (kn_sumsq is s = 1: the same bits): the norm of the
 *   unscaled gradient without an unscale pass. A NaN or inf element, or a
 *   product that overflows, makes the result NaN or inf, so it is the
 *   loss scaler's check too.
 *
 * kn_convert: dst[n] (dst_dt) = src[n] (src_dt), round-to-nearest-even
 *   when narrowing; dst and src must not overlap unless they are the same
 *   pointer and type.
 * kn_convert_spans: kn_convert of each of ns spans (a host array of
 *   kn_span) between the same two buffers: many small tensors (a model's
 *   norm weights and biases) in one op, which a GPU runs as a few launches
 *   rather than ns. Spans must not overlap in dst.
 * kn_round: x[n] = (float)(dt)x[n] in place: fp32 values rounded to what
 *   dt can hold (no-op for KN_F32). Where a 16-bit tensor is produced, the
 *   engine rounds the fp32 result with this, so the values it computes with
 *   are exactly the ones it stores.
 *
 * kn_embedding_fwd: out[N,C] (+)= table[ids[n], :]; accumulate=0 overwrites,
 *   1 adds (GPT-2: token embedding, then position embedding). ids are
 *   host-visible int32 on CPU, device int32 on CUDA (kn_alloc'd).
 * kn_embedding_bwd: dtable[ids[n], :] += dout[n, :] (parallel over C).
 *
 * kn_layernorm_fwd: out[N,C] = (x - mean) * rstd * w + b; saves mean[N],
 *   rstd[N]; b may be NULL. kn_layernorm_bwd: dx, dw, db.
 * kn_rmsnorm_fwd: out[N,C] = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps);
 *   saves rstd[N]. kn_rmsnorm_bwd: dx, dw.
 *   The backwards accumulate: dx += (any may be NULL), dw +=, db +=. dout
 *   is of type dout_dt: fp32, or dt itself (a product that wrote it
 *   rounded already; TY_EINVAL otherwise). With
 *   a 16-bit dt (x's type) they read dout as dt rounds it and store dx
 *   rounded to dt after its add: the values a 16-bit gradient tensor
 *   holds, with no separate kn_round pass before or after. dx_dt (NULL,
 *   or [N,C] of type dt) is written with dx as stored: the exact 16-bit
 *   copy a linear layer's backward GEMMs read next, made without a
 *   conversion pass over dx. Given without dx, dx_dt is the gradient
 *   itself, held in dt: read, added to and stored back rounded, the same
 *   values an fp32 dx holds at half its bytes (fp32 dt: dx_dt is fp32).
 *
 * kn_add_layernorm_fwd: the residual add and the norm that reads it, in
 *   one op: res[N,C] = a + b (kn_add: fp32 sum stored in dt, rounded once),
 *   then out, mean, rstd = kn_layernorm_fwd of res as stored (the rounded
 *   values). res may be a or b. The backward is kn_layernorm_bwd on res
 *   (the residual's gradient passes the add unchanged).
 * kn_add_rmsnorm_fwd: the same with kn_rmsnorm_fwd (rstd saved).
 *   Reference semantics (the CPU): kn_add then the norm, the same bits; on
 *   CUDA one kernel per row that keeps the sum's values for its
 *   statistics (docs/kernels.md, "Residual add fused into the norm").
 *
 * kn_matmul_fwd: out[N,M] = x[N,K] w[M,K]^T + bias[M] (bias may be NULL).
 * kn_matmul_bwd: dx[N,K] += dout w; dw[M,K] += dout^T x; dbias[M] += sum_n
 *   dout. Any may be NULL.
 *
 * kn_matmul16_fwd / kn_matmul16_bwd: the same products with w stored in
 *   dt (bf16, fp16; KN_F32 is kn_matmul_*) and x / dout holding values dt
 *   represents (the engine rounds them); fp32 results, fp32 accumulation.
 *   bf16 runs on oneDNN's bf16 GEMM where the build has it and the CPU has
 *   native code for it, else on converted weights and sgemm (measured:
 *   docs/benchmarks.md). dx, dw, dbias accumulate; any may be NULL.
 *   out_dt: the forward's output is written in that dtype (a 16-bit out
 *   holds round-to-nearest-even of the fp32 result, as kn_round gives);
 *   dout_dt: the backward's dout is read in that dtype. The engine's
 *   16-bit logits use both, so no [N, vocab] fp32 tensor is kept. The
 *   forward's bias is of type b_dt: fp32, or w's 16-bit dt (the engine's
 *   16-bit copy of its biases). With a 16-bit out_dt it holds values
 *   out_dt represents, as the engine's biases, read from 16-bit storage,
 *   do: a GPU adds it in that type (cuBLASLt's bias is of the output's
 *   type, so a bias already in it goes in as it is; docs/kernels.md).
 * kn_matmul16_dx: dx[N,K] = dout w, WRITTEN (not accumulated; dx's old
 *   contents are never read): matmul16_bwd's dx for a gradient buffer the
 *   product is the first to fill, which saves clearing it and reading it
 *   back (a GPU's GEMM runs with beta 0). w in dt (KN_F32: fp32 weights),
 *   dout read in dout_dt as matmul16_bwd reads it; the same values as
 *   zeroing dx, then matmul16_bwd with dx alone. dx is of type dx_dt:
 *   fp32, or dt (the fp32 product rounded once: the values a 16-bit
 *   backward that reads the fp32 dx as dt rounds it sees; TY_EINVAL for
 *   another type).
 *
 * kn_matmul_gelu_fwd: a linear layer and the GELU after it in one op (the
 *   GPT-2 MLP's c_fc): pre[N,M] = x w^T + bias, out[N,M] = gelu(pre). w is
 *   fp32 (dt KN_F32) or stored in dt; x is read in x_dt and pre and out are
 *   written in out_dt, each KN_F32 or dt (TY_EINVAL otherwise), as
 *   matmul16's: a 16-bit run passes its 16-bit activations as they are,
 *   and its bias (b_dt: fp32 or dt) holds dt values (matmul16's rule).
 *   Reference semantics (the CPU): with a 16-bit dt, GELU reads pre
 *   rounded to dt, as the unfused engine computed it. On a GPU this is
 *   cuBLASLt's GELU_AUX(_BIAS) epilogue (pre is the aux output, bf16 / fp16
 *   A and B), whose GELU reads the fp32 accumulator: a 16-bit run differs
 *   from the CPU by the rounding of pre (docs/kernels.md).
 * kn_matmul_dgelu: the backward through that GELU from the next linear's
 *   output gradient: dpre[N,K] = (dout[N,M] w[M,K]) * gelu'(pre[N,K]),
 *   WRITTEN (not accumulated: cuBLASLt's DGELU epilogue computes a fresh
 *   product), and dbias[K] += sum_n dpre (may be NULL). dout is read in
 *   dout_dt and pre in pre_dt (each KN_F32 or dt: the forward's out_dt for
 *   pre), and dpre is stored in pre_dt: a 16-bit run's dpre is the
 *   16-bit operand of the previous linear's GEMMs as it stands. With a
 *   16-bit dt, w is stored in dt, dout holds dt values, and the reference
 *   rounds the product and dpre to dt (the engine's rounding points). The
 *   next linear's dw / dbias are its own backward with dx NULL.
 *
 * kn_rope_fwd: rotary position embedding, Hugging Face rotate-half, in
 *   place on x laid out [B, T, H, D] with row stride ld: for i < D/2,
 *   theta_i = pos * base^(-2i/D), pos = t + pos_offset,
 *     x[i] = x[i] cos - x[i + D/2] sin;  x[i + D/2] = x[i + D/2] cos + x[i] sin.
 *   In a 16-bit dt each head is widened, rotated in fp32 and rounded once.
 * kn_rope_bwd: the transpose (rotation by -theta), in place on the gradient,
 *   of type dt likewise: a 16-bit gradient's rotation is the fp32 one of
 *   the same (exact) values, rounded once, as kn_convert would after it.
 * kn_rope_freq_fwd / _bwd: the same with the inverse frequencies given,
 *   theta_i = pos * inv_freq[i] (inv_freq: D/2 floats on the device), for
 *   scaled RoPE whose frequencies are not base^(-2i/D) (Llama 3's
 *   rope_type "llama3"); the caller computes them once.
 *
 * kn_attention_fwd: causal scaled-dot-product attention with grouped-query
 *   heads. q: [B, T, Hq, D] with row stride ldq; k, v: [B, T, Hkv, D] with
 *   row stride ldkv (Hq % Hkv == 0; query head h uses kv head h/(Hq/Hkv)),
 *   so GPT-2's fused qkv [B, T, 3C] is q = qkv, k = qkv + C, v = qkv + 2C,
 *   ldq = ldkv = 3C. out: [B, T, Hq, D] contiguous. lse: [B, Hq, T], the
 *   log-sum-exp of each row's scores — all the backward needs besides
 *   out; no T x T matrix is kept. Scores are s_ij = scale q_i . k_j
 *   (scale 0 means 1/sqrt(D); Gemma passes query_pre_attn_scalar^-1/2),
 *   then, when softcap > 0, cap * tanh(s_ij / cap) (Gemma 2's
 *   attn_logit_softcapping). Row i sees keys j <= i, and with window > 0
 *   only those with i - j < window (sliding-window layers, transformers'
 *   mask). softcap 0 and window 0 are off.
 * kn_attention_kv_fwd: the same attention for Tq query rows that are the
 *   last Tq of Tk positions (Tq <= Tk): q [B, Tq, Hq, D], k, v [B, Tk, Hkv,
 *   D] (strides ldq, ldkv), query row r at position Tk - Tq + r sees keys
 *   j <= that position (and the window), out [B, Tq, Hq, D], lse [B, Hq,
 *   Tq]. Generation's step over a KV cache: the new rows against every
 *   cached row. Tq == Tk is kn_attention_fwd, with the same bits.
 * kn_attention_bwd: dq, dk, dv in the layouts/strides of q, k, v
 *   (WRITTEN, not accumulated: every row of each head is stored once; the
 *   columns of a row stride outside them are not touched; any may be
 *   NULL), of type g_dt: fp32, or dt (each gradient rounded once from its
 *   fp32 sum: what kn_convert of the fp32 result gives, so a 16-bit step's
 *   GEMMs read them as they stand), from dout, the forward's out and lse, and q, k, v, with
 *   the forward's scale, softcap and window; probabilities are recomputed
 *   tile by tile, and under a soft-cap dS is multiplied by 1 - tanh^2 of
 *   the recomputed score. With a 16-bit dt it reads dout as dt rounds it
 *   (the norms' rule). dout is of type dout_dt: fp32, or dt itself (a
 *   producer rounded it already: the same values as the fp32 dout it
 *   rounded), [B, T, Hq, D] packed.
 *
 * kn_gelu_fwd/bwd: tanh approximation (GPT-2's gelu_new); the backward
 *   accumulates into dx.
 * kn_swiglu_fwd/bwd: out = silu(gate) * up (Llama MLP).
 * kn_geglu_fwd/bwd: out = gelu_tanh(gate) * up (Gemma's MLP).
 *   The gated backwards WRITE dgate and dup (either may be NULL): the
 *   engine's buffers for them hold nothing before; in g_dt, fp32 or dt
 *   (each rounded once from its fp32 value, as kn_attention_bwd's). With
 *   a 16-bit dt, all three backwards read dout as dt rounds it (the
 *   norms' rule).
 * kn_dropout_fwd/bwd: inverted dropout, out = x * mask / (1-p), mask[i] in
 *   {0,1} drawn from (seed, offset + i) by a counter-based generator (same
 *   on every device and on resume). p == 0 copies.
 *
 * DoRA (PEFT's DoraLinearLayer on a layer W [M,K]; all fp32):
 * kn_dora_norm: norm[o] = || w[o,:] + s d[o,:] ||_2 (d = B A, the LoRA
 *   product), g[o] = mag[o] / norm[o]; one thread per row, in k order.
 * kn_dora_fwd: with yb = y (when y != NULL: the base product of the
 *   dropped-out input, no bias) else out - b (b may be NULL):
 *   z = yb + lr s and out += (g - 1) yb + (g lr) s, [N,M] by columns o.
 * kn_dora_bwd: dlr = (dout g) s; dy = dout (g - 1); dmag[o] += (sum_n
 *   dout z) / norm[o] (one thread per column, in n order). Any of dlr, dy
 *   may be NULL.
 *
 * kn_logits_fwd: the loss head's lm_head GEMM, logits[N, V] = x[N, K]
 *   w[V, K]^T, with logits rows ld >= V elements apart (kn_logit_ld); x, w
 *   and the logits in dt (fp32 weights for KN_F32), as kn_matmul16_fwd
 *   with dt everywhere. Columns V..ld-1 are not written.
 * kn_logits_bwd: its backward, dx[N, K] += dlogits w, dw[V, K] +=
 *   dlogits^T x (fp32; either may be NULL), reading only the first V
 *   columns of dlogits[N, ld] (in dt).
 *
 * kn_crossentropy_fwd: losses[N] = -log softmax(logits[n])[targets[n]], 0
 *   where targets[n] == -100 (evaluation). Rows of V logits are ld >= V
 *   elements apart (both ops; columns V..ld-1 are neither read nor
 *   written, dlogits' included). targets: int32, same memory
 *   rules as embedding ids. softcap > 0 (Gemma 2's final_logit_softcapping)
 *   takes the loss on y = cap * tanh(logits / cap) instead, and the
 *   backward below multiplies the gradient by dy/dlogits = 1 - (y/cap)^2,
 *   so the capped logits never need a buffer of their own. 0 = off.
 * kn_softcap: x[n] = cap * tanh(x[n] / cap) in place (cap 0: no-op): the
 *   capped logits generation and evaluation read.
 * kn_crossentropy_fwd_bwd: the training step's loss: losses as above (may
 *   be NULL) and dlogits[N,V] = (softmax(logits) - onehot(target)) * scale,
 *   0 rows where ignored, in one pass over the logits. OVERWRITES dlogits,
 *   which may alias logits. scale = 1 / (non-ignored targets in the step).
 *   dt: the dtype of logits and dlogits (fp32, or 16-bit: read as fp32,
 *   computed in fp32, dlogits rounded to nearest-even when written).
 *   softcap as in kn_crossentropy_fwd: dlogits is the gradient with
 *   respect to the raw (uncapped) logits.
 *
 * kn_master_split: fp32 x[n] -> hi[n] = bf16 round-to-nearest-even of x
 *   and lo[n] = the rest, so hi's bits << 16 plus lo as a signed 16-bit
 *   number are x's bits exactly: an fp32 master weight stored as the bf16
 *   weight the forward reads plus 2 more bytes, not 4. The one x that does
 *   not fit (an exact tie kept at an even hi, 1 in 65536) is moved one
 *   fp32 ulp towards hi first (so hi is still its rounding).
 * kn_master_join: x[n] from hi[n], lo[n] (exact).
 *
 * kn_nf4_dequant: out[n] (dt) = the NF4 weight w's n elements (kn_nf4
 *   above) computed in fp32 and stored in dt (round-to-nearest-even).
 * kn_nf4_matmul_fwd: out[N,M] = x[N,K] deq(w)^T + bias[M], deq(w) rounded
 *   to the compute dtype dt first (what bitsandbytes' matmul_4bit
 *   multiplies by); fp32 products and accumulation.
 * kn_nf4_matmul_bwd: dx[N,K] += dout[N,M] deq(w): the gradient flows to the
 *   input only; the 4-bit base is frozen (QLoRA), so there is no dw.
 *
 * kn_adamw: one AdamW update on n parameters (torch.optim.AdamW):
 *     p -= lr * wd * p                      (decoupled decay; wd may be 0)
 *     m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
 *     p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
 *   step t counts from 1. Call once per parameter group.
 *   pdt KN_F32: p is the fp32 parameter (plo NULL); KN_BF16: p / plo are
 *   kn_master_split's hi / lo, joined, updated in fp32 and split again
 *   (fp16 has no such split: a KN_F16 pdt is an error).
 * kn_adamw_blocks: kn_adamw on each of nb blocks (a host array of
 *   kn_adamw_block; the pointers in it are device memory) in one op, with
 *   the shared settings of hp: the whole optimizer step of a model, one
 *   parallel job on the CPU. The gradient each block's update reads is
 *   (g * hp.gscale[0]) * hp.gscale[1] in fp32 (factors of 1 change no bit:
 *   kn_adamw is a block with gscale {1, 1}), and with hp.zero_grad the
 *   block's g is 0 afterwards. Blocks must not overlap. */

#endif
