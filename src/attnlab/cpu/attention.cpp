// Fused causal self-attention for CPUs in float32, forward and backward (kernels=attention).
//
// Per (batch, head), with Q, K, V, O, dO rows of CK_HD floats (the head dimension, a compile-time constant,
// a multiple of 16) and s = scale:
//
//   S_ij = s q_i . k_j                      j <= i (causal), -inf above the diagonal
//   P_i  = softmax(S_i)                     kept for the backward pass: (T, TP) floats, zeros above the diagonal
//   o_i  = sum_j P_ij v_j
//
//   delta_i = dO_i . o_i
//   dS_ij   = P_ij (dO_i . v_j - delta_i)   (the softmax's backward; zero where P is)
//   dq_i = s sum_j dS_ij k_j,   dk_j = s sum_i dS_ij q_i,   dv_j = sum_i P_ij dO_i
//
// TP is T rounded up to VW = 16, the vector width in floats. The scores of 8 query rows are computed at
// once against 16 keys (the keys transposed once per head), and the weighted sums of rows (o, dq, dk, dv)
// 8 output rows at a time, so that each row read is used 8 times. e^x is cpu/vec.h's (a degree-6
// polynomial after Cody-Waite range reduction, relative error ~1e-7, like the float32 exp). Inputs may be
// strided views (the heads of a fused QKV projection) as long as the last dimension is contiguous.
//
// Built by attnlab/cpu/attention.py with -O3 -march=native, -DCK_HD=<head dim> and
// -DCK_NS=<op namespace>; GCC's vector extensions give AVX-512 code where the CPU has it, narrower
// vectors elsewhere.

#include <ATen/core/Tensor.h>  // the Tensor type and its methods only, not every ATen function
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "vec.h"  // vf (16 floats), splat, load, store, exp_nonpositive, transpose_rows

#ifndef CK_HD
#error "CK_HD (the head dimension) must be defined"
#endif
#ifndef CK_NS
#error "CK_NS (the op namespace) must be defined"
#endif

namespace {

constexpr long NV = CK_HD / VW;  // vectors per row
constexpr long RB = 8;           // rows per block
static_assert(CK_HD % VW == 0, "the head dimension must be a multiple of 16");

// horizontal sum and max of the 16 lanes: four halving steps
inline vf half_swap(vf v, int h) {
    switch (h) {
        case 8: return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
        case 4: return __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
        case 2: return __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
        default: return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    }
}
inline float hsum(vf v) {
    for (int h = 8; h >= 1; h /= 2) v += half_swap(v, h);
    return v[0];
}
inline float hmax(vf v) {
    for (int h = 8; h >= 1; h /= 2) {
        vf w = half_swap(v, h);
        v = w > v ? w : v;
    }
    return v[0];
}
const vf LANE = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

// out[r] = sum_d X[r * xs + d] * Mt[d * TP + :VW] for r < R: a (R x CK_HD) by (CK_HD x VW) product
template <int R>
inline void rows_times_block(const float *X, long xs, const float *Mt, long TP, vf *out) {
    vf a[R], b[R];
    for (int r = 0; r < R; r++) a[r] = b[r] = splat(0.0f);
    for (long d = 0; d < CK_HD; d += 2) {
        vf m0 = load(Mt + d * TP), m1 = load(Mt + (d + 1) * TP);
        for (int r = 0; r < R; r++) {
            a[r] += X[r * xs + d] * m0;
            b[r] += X[r * xs + d + 1] * m1;
        }
    }
    for (int r = 0; r < R; r++) out[r] = a[r] + b[r];
}

inline void scores_block(long R, const float *X, long xs, const float *Mt, long TP, vf *out) {
    if (R == RB) return rows_times_block<RB>(X, xs, Mt, TP, out);
    for (long r = 0; r < R; r++) rows_times_block<1>(X + r * xs, xs, Mt, TP, out + r);
}

// out[u * os + :] = sum_{j0 <= j < j1} w[u * wr + j * wc] * M[j * ms + :] for u < R (CK_HD floats each)
template <int R>
inline void weighted_rows(const float *w, long wr, long wc, const float *M, long ms, long j0, long j1, float *out,
                          long os) {
    vf a[R][NV];
    for (int u = 0; u < R; u++)
        for (long c = 0; c < NV; c++) a[u][c] = splat(0.0f);
    for (long j = j0; j < j1; j++) {
        vf m[NV];
        for (long c = 0; c < NV; c++) m[c] = load(M + j * ms + c * VW);
        for (int u = 0; u < R; u++) {
            float x = w[u * wr + j * wc];
            for (long c = 0; c < NV; c++) a[u][c] += x * m[c];
        }
    }
    for (int u = 0; u < R; u++)
        for (long c = 0; c < NV; c++) store(out + u * os + c * VW, a[u][c]);
}

inline void weighted_block(long R, const float *w, long wr, long wc, const float *M, long ms, long j0, long j1,
                           float *out, long os) {
    if (R == RB) return weighted_rows<RB>(w, wr, wc, M, ms, j0, j1, out, os);
    for (long u = 0; u < R; u++) weighted_rows<1>(w + u * wr, wr, wc, M, ms, j0, j1, out + u * os, os);
}

struct Rows {  // one head's rows: base pointer and row stride
    const float *p;
    long s;
};

void forward_head(Rows Q, Rows K, Rows V, float *O, long os, float *P, long T, long TP, float scale, float *kt) {
    transpose_rows(K.p, K.s, T, TP, CK_HD, kt);  // K^T (CK_HD, TP), zero-padded
    for (long i0 = 0; i0 < T; i0 += RB) {
        long R = T - i0 < RB ? T - i0 : RB;
        long nb = (i0 + R - 1) / VW + 1;  // key blocks holding keys 0 .. i0 + R - 1 (the same for all R rows)
        vf m[RB];  // each row's running maximum, lane by lane
        for (long r = 0; r < R; r++) m[r] = splat(-INFINITY);
        for (long b = 0; b < nb; b++) {
            vf s[RB];
            scores_block(R, Q.p + i0 * Q.s, Q.s, kt + b * VW, TP, s);
            for (long r = 0; r < R; r++) {
                vf x = s[r] * scale;
                if (b == nb - 1) x = (LANE + (float)(b * VW) > (float)(i0 + r)) ? splat(-INFINITY) : x;  // keys after i
                store(P + (i0 + r) * TP + b * VW, x);
                m[r] = x > m[r] ? x : m[r];
            }
        }
        for (long r = 0; r < R; r++) {
            long i = i0 + r;
            float *p = P + i * TP;
            float max = hmax(m[r]);
            vf sum = splat(0.0f);
            for (long b = 0; b < nb; b++) {
                vf e = exp_nonpositive(load(p + b * VW) - max);
                if (b == nb - 1) e = (LANE + (float)(b * VW) > (float)i) ? splat(0.0f) : e;  // exactly 0 after i
                store(p + b * VW, e);
                sum += e;
            }
            float inv = 1.0f / hsum(sum);
            for (long b = 0; b < nb; b++) store(p + b * VW, load(p + b * VW) * inv);
            for (long b = nb; b < TP / VW; b++) store(p + b * VW, splat(0.0f));
        }
        weighted_block(R, P + i0 * TP, TP, 1, V.p, V.s, 0, i0 + R, O + i0 * os, os);  // o_i = sum_j P_ij v_j
    }
}

void backward_head(Rows Q, Rows K, Rows V, Rows O, const float *P, Rows G, float *dQ, float *dK, float *dV, long ds,
                   long T, long TP, float scale, float *vt, float *dS) {
    transpose_rows(V.p, V.s, T, TP, CK_HD, vt);  // V^T (CK_HD, TP), zero-padded
    for (long i0 = 0; i0 < T; i0 += RB) {
        long R = T - i0 < RB ? T - i0 : RB;
        long nb = (i0 + R - 1) / VW + 1;
        float delta[RB];
        for (long r = 0; r < R; r++) {
            vf acc = splat(0.0f);
            for (long c = 0; c < NV; c++) acc += load(G.p + (i0 + r) * G.s + c * VW) * load(O.p + (i0 + r) * O.s + c * VW);
            delta[r] = hsum(acc);
        }
        for (long b = 0; b < nb; b++) {
            vf dp[RB];
            scores_block(R, G.p + i0 * G.s, G.s, vt + b * VW, TP, dp);  // dO_i . v_j
            for (long r = 0; r < R; r++)
                store(dS + (i0 + r) * TP + b * VW, load(P + (i0 + r) * TP + b * VW) * (dp[r] - delta[r]) * scale);
        }
        for (long r = 0; r < R; r++)
            for (long b = nb; b < TP / VW; b++) store(dS + (i0 + r) * TP + b * VW, splat(0.0f));
        weighted_block(R, dS + i0 * TP, TP, 1, K.p, K.s, 0, i0 + R, dQ + i0 * ds, ds);  // dq_i = sum_j dS_ij k_j
    }
    for (long j0 = 0; j0 < T; j0 += RB) {  // columns j0 .. j0 + R - 1 of dS and P, rows i >= j0
        long R = T - j0 < RB ? T - j0 : RB;
        weighted_block(R, dS + j0, 1, TP, Q.p, Q.s, j0, T, dK + j0 * ds, ds);  // dk_j = sum_i dS_ij q_i
        weighted_block(R, P + j0, 1, TP, G.p, G.s, j0, T, dV + j0 * ds, ds);   // dv_j = sum_i P_ij dO_i
    }
}

struct Scratch {  // per-thread buffers, 64-byte aligned
    explicit Scratch(long n) : p(static_cast<float *>(std::aligned_alloc(64, ((n * 4 + 63) / 64) * 64))) {
        TORCH_CHECK(p != nullptr, "cpu-fused attention: out of memory");
    }
    ~Scratch() { std::free(p); }
    float *p;
};

at::Tensor rows_contiguous(const at::Tensor &x) { return x.stride(3) == 1 ? x : x.contiguous(); }

void check(const at::Tensor &x, const char *name) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 4 && x.size(3) == CK_HD,
                "cpu-fused attention: ", name, " must be a (B, H, T, ", CK_HD, ") float32 CPU tensor");
}

Rows head(const at::Tensor &x, long b, long h) {
    return {x.data_ptr<float>() + b * x.stride(0) + h * x.stride(1), x.stride(2)};
}

std::tuple<at::Tensor, at::Tensor> attn(const at::Tensor &q_, const at::Tensor &k_, const at::Tensor &v_,
                                        double scale) {
    check(q_, "q"), check(k_, "k"), check(v_, "v");
    TORCH_CHECK(k_.sizes() == q_.sizes() && v_.sizes() == q_.sizes(), "cpu-fused attention: q, k, v shapes differ");
    auto q = rows_contiguous(q_), k = rows_contiguous(k_), v = rows_contiguous(v_);
    long B = q.size(0), H = q.size(1), T = q.size(2), TP = (T + VW - 1) / VW * VW;
    auto o = at::empty(q.sizes(), q.options());
    auto P = at::empty({B, H, T, TP}, q.options());
    at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
        Scratch kt(CK_HD * TP);
        for (int64_t bh = begin; bh < end; bh++) {
            long b = bh / H, h = bh % H;
            Rows O = head(o, b, h);
            forward_head(head(q, b, h), head(k, b, h), head(v, b, h), const_cast<float *>(O.p), O.s,
                         P.data_ptr<float>() + bh * T * TP, T, TP, static_cast<float>(scale), kt.p);
        }
    });
    return {o, P};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attn_backward(const at::Tensor &q_, const at::Tensor &k_,
                                                             const at::Tensor &v_, const at::Tensor &o_,
                                                             const at::Tensor &P_, const at::Tensor &g_, double scale) {
    check(g_, "grad");
    auto q = rows_contiguous(q_), k = rows_contiguous(k_), v = rows_contiguous(v_), o = rows_contiguous(o_),
         g = rows_contiguous(g_), P = P_.contiguous();
    long B = q.size(0), H = q.size(1), T = q.size(2), TP = (T + VW - 1) / VW * VW;
    auto dq = at::empty(q.sizes(), q.options()), dk = at::empty(q.sizes(), q.options()),
         dv = at::empty(q.sizes(), q.options());
    at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
        Scratch vt(CK_HD * TP), dS(T * TP);
        for (int64_t bh = begin; bh < end; bh++) {
            long b = bh / H, h = bh % H;
            float *dQ = const_cast<float *>(head(dq, b, h).p), *dK = const_cast<float *>(head(dk, b, h).p),
                  *dV = const_cast<float *>(head(dv, b, h).p);
            backward_head(head(q, b, h), head(k, b, h), head(v, b, h), head(o, b, h), P.data_ptr<float>() + bh * T * TP,
                          head(g, b, h), dQ, dK, dV, dq.stride(2), T, TP, static_cast<float>(scale), vt.p, dS.p);
        }
    });
    return {dq, dk, dv};
}

}  // namespace

TORCH_LIBRARY(CK_NS, m) {
    m.def("attn(Tensor q, Tensor k, Tensor v, float scale) -> (Tensor, Tensor)");
    m.def("attn_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor P, Tensor g, float scale) "
          "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(CK_NS, CPU, m) {
    m.impl("attn", &attn);
    m.impl("attn_backward", &attn_backward);
}
