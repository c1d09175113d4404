// The selective scan on CPUs, forward and backward in one C++ loop each (kernels=scan).
//
// Per batch row b and channel c (independent), with a_t = exp(delta_t A_c) (N decays, 0 < a <= 1) and
// x_t = delta_t u_t:
//
//   h_t = a_t * h_{t-1} + x_t B_t           (N values)        y_t = C_t . h_t
//
// The forward pass keeps only h at the start of every segment of SEG steps ("checkpoints", (B, d, S, N) with
// S = ceil(T / SEG)) and the final state. The backward pass walks the segments from the last to the first,
// recomputes each segment's states and decays from its checkpoint into a small buffer (SEG x N per channel),
// then runs the adjoint recurrence backwards through it, with g_t = dLoss/dy_t and gh the adjoint of h:
//
//   gh    <- gh + g_t C_t                    (dLoss/dh_t: from y_t and, carried in, from h_{t+1})
//   dC_t  += g_t h_t                         dB_t += x_t gh
//   dx_t   = gh . B_t                        du_t = dx_t delta_t
//   ddelta_t = dx_t u_t + sum_n gh_n h_{t-1,n} a_{t,n} A_n
//   dA    += gh * h_{t-1} * a_t * delta_t    (summed over b and t)
//   gh    <- gh * a_t                        (dLoss/dh_{t-1}; after t = 0 it is dLoss/dh_0)
//
// So the memory autograd keeps is O(B d N T / SEG), not the O(B d N T) of the chunked form, and the time is
// O(B d N T) with no chunk-squared factor. Channels are split between threads; dB and dC, summed over the
// channels, are accumulated per thread and added up at the end.
//
// The loops over the N state values are what the compiler vectorises. For the common state sizes (8, 16, 32, 64)
// the kernel is compiled with N as a constant; in float32 there, e^x is a degree-6 polynomial after range
// reduction (exp_vec: relative error <= 2.2e-7, like the float32 exp), because std::exp is one library call
// per value and stops the vectorisation. Other sizes, and float64, use std::exp.
//
// Built by attnlab/cpu/scan.py with -O3 -march=native and -DCK_NS=<op namespace>.

#include <ATen/Dispatch.h>
#include <ATen/core/Tensor.h>  // the Tensor type and its methods only, not every ATen function
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#ifndef CK_NS
#error "CK_NS (the op namespace) must be defined"
#endif

namespace {

constexpr long SEG = 64;  // steps per checkpoint segment

// e^x in float32: x = k ln2 + r with k = round(x / ln2) and |r| <= ln2/2, e^r by its Taylor polynomial of
// degree 6 and 2^k from the exponent bits. k is rounded by adding 1.5 * 2^23 (its low bits then hold k), with
// no float-to-int conversion, so that GCC vectorises the loops that call it. Arguments are clamped to
// [-87, 88] (the model's are <= 0: a = e^(delta A) with delta > 0, A < 0); the relative error there is
// <= 2.2e-7 (measured against the double exp every 2^-9).
inline float exp_vec(float x) {
    x = std::min(std::max(x, -87.0f), 88.0f);
    const float j = x * 1.44269504088896341f + 12582912.0f;
    const float k = j - 12582912.0f;
    const float r = x - k * 0.693145751953125f - k * 1.428606765330187045e-06f;
    const float p =
        1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    return p * __builtin_bit_cast(float, (__builtin_bit_cast(int32_t, j) - 0x4B400000 + 127) << 23);
}
inline double exp_vec(double x) { return std::exp(x); }
// The exp of the loops over the state: exp_vec where the state size NC is known at compile time (those loops
// vectorise), std::exp otherwise (there the scalar library call is the faster one).
template <long NC, typename T>
inline T exp_state(T x) {
    if constexpr (NC != 0) return exp_vec(x);
    else return std::exp(x);
}

template <typename T, long NC>
void forward_rows(const T *u, const T *dl, const T *A, const T *Bm, const T *Cm, const T *h0, T *y, T *ckpt, T *hT,
                  long Bn, long Tn, long d, long Nrt, long c0, long c1) {
    const long N = NC ? NC : Nrt;
    const long S = (Tn + SEG - 1) / SEG;
    std::vector<T> hv(N);
    T *h = hv.data();  // a plain pointer: the vectoriser cannot load std::vector's own pointer in the loop
    for (long b = 0; b < Bn; ++b) {
        const T *ub = u + b * Tn * d, *db = dl + b * Tn * d, *Bb = Bm + b * Tn * N, *Cb = Cm + b * Tn * N;
        T *yb = y + b * Tn * d;
        for (long c = c0; c < c1; ++c) {
            const T *Ac = A + c * N;
            for (long n = 0; n < N; ++n) h[n] = h0 ? h0[(b * d + c) * N + n] : T(0);
            T *ck = ckpt + (b * d + c) * S * N;
            for (long t = 0; t < Tn; ++t) {
                if (t % SEG == 0)
                    for (long n = 0; n < N; ++n) ck[(t / SEG) * N + n] = h[n];
                const T dt = db[t * d + c], x = dt * ub[t * d + c];
                const T *Bt = Bb + t * N, *Ct = Cb + t * N;
                T acc = 0;
#pragma omp simd reduction(+ : acc)
                for (long n = 0; n < N; ++n) {
                    h[n] = exp_state<NC>(dt * Ac[n]) * h[n] + x * Bt[n];
                    acc += Ct[n] * h[n];
                }
                yb[t * d + c] = acc;
            }
            for (long n = 0; n < N; ++n) hT[(b * d + c) * N + n] = h[n];
        }
    }
}

template <typename T, long NC>
void backward_rows(const T *u, const T *dl, const T *A, const T *Bm, const T *Cm, const T *ckpt, const T *gy,
                   const T *ghT, T *du, T *ddl, T *dA, T *dB, T *dC, T *dh0, long Bn, long Tn, long d, long Nrt,
                   long c0, long c1) {
    const long N = NC ? NC : Nrt, S = (Tn + SEG - 1) / SEG;
    std::vector<T> hs((SEG + 1) * N), as(SEG * N), ghv(N), dAv(N);
    T *gh = ghv.data(), *dAc = dAv.data();
    for (long c = c0; c < c1; ++c) {
        const T *Ac = A + c * N;
        for (long n = 0; n < N; ++n) dAc[n] = 0;
        for (long b = 0; b < Bn; ++b) {
            const T *ub = u + b * Tn * d, *db = dl + b * Tn * d, *Bb = Bm + b * Tn * N, *Cb = Cm + b * Tn * N;
            const T *gb = gy + b * Tn * d;
            T *dub = du + b * Tn * d, *ddb = ddl + b * Tn * d, *dBb = dB + b * Tn * N, *dCb = dC + b * Tn * N;
            const T *ck = ckpt + (b * d + c) * S * N;
            for (long n = 0; n < N; ++n) gh[n] = ghT ? ghT[(b * d + c) * N + n] : T(0);
            for (long s = S - 1; s >= 0; --s) {
                const long t0 = s * SEG, L = std::min(SEG, Tn - t0);
                for (long n = 0; n < N; ++n) hs[n] = ck[s * N + n];
                for (long j = 0; j < L; ++j) {  // recompute the segment: hs[j + 1] = h_{t0 + j}
                    const long t = t0 + j;
                    const T dt = db[t * d + c], x = dt * ub[t * d + c];
                    const T *Bt = Bb + t * N;
                    T *hp = hs.data() + j * N, *hn = hp + N, *a = as.data() + j * N;
#pragma omp simd
                    for (long n = 0; n < N; ++n) {
                        a[n] = exp_state<NC>(dt * Ac[n]);
                        hn[n] = a[n] * hp[n] + x * Bt[n];
                    }
                }
                for (long j = L - 1; j >= 0; --j) {  // the adjoint recurrence, backwards in time
                    const long t = t0 + j;
                    const T dt = db[t * d + c], uu = ub[t * d + c], x = dt * uu, g = gb[t * d + c];
                    const T *Bt = Bb + t * N, *Ct = Cb + t * N, *hp = hs.data() + j * N, *hn = hp + N;
                    const T *a = as.data() + j * N;
                    T *dBt = dBb + t * N, *dCt = dCb + t * N;
                    T dx = 0, dda = 0;
#pragma omp simd reduction(+ : dx, dda)
                    for (long n = 0; n < N; ++n) {
                        const T ghn = gh[n] + g * Ct[n];
                        dCt[n] += g * hn[n];
                        dBt[n] += x * ghn;
                        dx += ghn * Bt[n];
                        const T w = ghn * hp[n] * a[n];  // dLoss/d(delta_t A_n)
                        dda += w * Ac[n];
                        dAc[n] += w * dt;
                        gh[n] = ghn * a[n];
                    }
                    dub[t * d + c] = dx * dt;
                    ddb[t * d + c] = dx * uu + dda;
                }
            }
            for (long n = 0; n < N; ++n) dh0[(b * d + c) * N + n] = gh[n];
        }
        for (long n = 0; n < N; ++n) dA[c * N + n] = dAc[n];
    }
}

void check(const at::Tensor &u, const at::Tensor &delta, const at::Tensor &A, const at::Tensor &B,
           const at::Tensor &C) {
    TORCH_CHECK(u.device().is_cpu() && u.dim() == 3 && delta.sizes() == u.sizes(), "u, delta: (B, T, d) CPU");
    TORCH_CHECK(A.dim() == 2 && A.size(0) == u.size(2), "A: (d, N)");
    TORCH_CHECK(B.dim() == 3 && B.size(0) == u.size(0) && B.size(1) == u.size(1) && B.size(2) == A.size(1),
                "B: (B, T, N)");
    TORCH_CHECK(C.sizes() == B.sizes(), "C: (B, T, N)");
    for (const auto *t : {&delta, &A, &B, &C}) TORCH_CHECK(t->scalar_type() == u.scalar_type(), "one dtype");
}

// Calls fn(std::integral_constant<long, NC>) with NC = N for the common state sizes (Mamba's 16; 8, 32, 64),
// whose loops over the state the compiler then vectorises for that length, and NC = 0 (N read at run time)
// for the others.
template <typename Fn>
void with_state_size(long N, Fn &&fn) {
    switch (N) {
        case 8: fn(std::integral_constant<long, 8>{}); break;
        case 16: fn(std::integral_constant<long, 16>{}); break;
        case 32: fn(std::integral_constant<long, 32>{}); break;
        case 64: fn(std::integral_constant<long, 64>{}); break;
        default: fn(std::integral_constant<long, 0>{});
    }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> scan(const at::Tensor &u_, const at::Tensor &delta_,
                                                    const at::Tensor &A_, const at::Tensor &B_,
                                                    const at::Tensor &C_, const at::Tensor &h0_) {
    check(u_, delta_, A_, B_, C_);
    auto u = u_.contiguous(), delta = delta_.contiguous(), A = A_.contiguous(), B = B_.contiguous(),
         C = C_.contiguous(), h0 = h0_.contiguous();
    const long Bn = u.size(0), Tn = u.size(1), d = u.size(2), N = A.size(1), S = (Tn + SEG - 1) / SEG;
    TORCH_CHECK(h0.numel() == 0 || (h0.dim() == 3 && h0.size(0) == Bn && h0.size(1) == d && h0.size(2) == N),
                "h0: (B, d, N) or empty");
    auto y = at::empty_like(u), hT = at::empty({Bn, d, N}, u.options()), ckpt = at::empty({Bn, d, S, N}, u.options());
    AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "scan", [&] {
        const scalar_t *h0p = h0.numel() ? h0.data_ptr<scalar_t>() : nullptr;
        with_state_size(N, [&](auto nc) {
            at::parallel_for(0, d, 1, [&](long c0, long c1) {
                forward_rows<scalar_t, decltype(nc)::value>(
                    u.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(), B.data_ptr<scalar_t>(),
                    C.data_ptr<scalar_t>(), h0p, y.data_ptr<scalar_t>(), ckpt.data_ptr<scalar_t>(),
                    hT.data_ptr<scalar_t>(), Bn, Tn, d, N, c0, c1);
            });
        });
    });
    return {y, hT, ckpt};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> scan_backward(
    const at::Tensor &u_, const at::Tensor &delta_, const at::Tensor &A_, const at::Tensor &B_, const at::Tensor &C_,
    const at::Tensor &ckpt_, const at::Tensor &gy_, const at::Tensor &ghT_) {
    check(u_, delta_, A_, B_, C_);
    auto u = u_.contiguous(), delta = delta_.contiguous(), A = A_.contiguous(), B = B_.contiguous(),
         C = C_.contiguous(), ckpt = ckpt_.contiguous(), gy = gy_.contiguous(), ghT = ghT_.contiguous();
    const long Bn = u.size(0), Tn = u.size(1), d = u.size(2), N = A.size(1);
    TORCH_CHECK(gy.sizes() == u.sizes(), "grad_y: (B, T, d)");
    const long threads = at::get_num_threads();
    auto du = at::empty_like(u), ddelta = at::empty_like(u), dA = at::empty_like(A), dh0 = at::empty({Bn, d, N}, u.options());
    auto dBs = at::zeros({threads, Bn, Tn, N}, u.options()), dCs = at::zeros({threads, Bn, Tn, N}, u.options());
    AT_DISPATCH_FLOATING_TYPES(u.scalar_type(), "scan_backward", [&] {
        const scalar_t *ghTp = ghT.numel() ? ghT.data_ptr<scalar_t>() : nullptr;
        with_state_size(N, [&](auto nc) {
            at::parallel_for(0, d, 1, [&](long c0, long c1) {
                const long k = at::get_thread_num();
                backward_rows<scalar_t, decltype(nc)::value>(
                    u.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(), A.data_ptr<scalar_t>(), B.data_ptr<scalar_t>(),
                    C.data_ptr<scalar_t>(), ckpt.data_ptr<scalar_t>(), gy.data_ptr<scalar_t>(), ghTp,
                    du.data_ptr<scalar_t>(), ddelta.data_ptr<scalar_t>(), dA.data_ptr<scalar_t>(),
                    dBs[k].data_ptr<scalar_t>(), dCs[k].data_ptr<scalar_t>(), dh0.data_ptr<scalar_t>(), Bn, Tn, d, N,
                    c0, c1);
            });
        });
    });
    return {du, ddelta, dA, dBs.sum(0), dCs.sum(0), dh0};
}

}  // namespace

TORCH_LIBRARY(CK_NS, m) {
    m.def("scan(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor h0) -> (Tensor, Tensor, Tensor)");
    m.def("scan_backward(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor ckpt, Tensor grad_y, "
          "Tensor grad_hT) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(CK_NS, CPU, m) {
    m.impl("scan", &scan);
    m.impl("scan_backward", &scan_backward);
}
