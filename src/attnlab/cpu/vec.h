// Vectors of 16 floats for attnlab's C++ CPU kernels (GCC/Clang vector extensions: AVX-512 code where the CPU
// has it, narrower vectors elsewhere), e^x for x <= 0, the exact GELU with its slope, and transposes in
// 16 x 16 register tiles.
//
//   e^x = 2^n e^r,  x = n ln2 + r (Cody-Waite: ln2 in two parts), |r| <= ln2/2,
//   e^r by its Taylor polynomial of degree 6 (relative error ~1e-7, like the float32 exp); 2^n from its bits.
//   x is clamped at -87 (e^-87 ~ 1.6e-38, the smallest normal float's order), so the result is never subnormal.
//
// Included by cpu/attention.cpp, cpu/gelu.cpp, cpu/linear.cpp and cpu/step.cpp;
// cpu/build.py keys their builds on this file's text too.

#pragma once

#include <cstdint>
#include <cstring>

namespace {

constexpr long VW = 16;  // floats per vector

typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));

inline vf splat(float x) { return vf{} + x; }
inline vf load(const float *p) { vf v; std::memcpy(&v, p, sizeof v); return v; }
inline void store(float *p, vf v) { std::memcpy(p, &v, sizeof v); }

// e^x for x <= 0: x = n ln2 + r with |r| <= ln2/2, e^r by its Taylor polynomial of degree 6, 2^n from bits
inline vf exp_nonpositive(vf x) {
    x = x < splat(-87.0f) ? splat(-87.0f) : x;
    vf t = x * 1.44269504088896341f + 0.5f;
    vf n = __builtin_convertvector(__builtin_convertvector(t, vi), vf);
    n = n > t ? n - 1.0f : n;  // floor(t)
    vf r = x - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
    vf p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
    vi bits = (__builtin_convertvector(n, vi) + 127) << 23;
    vf scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

// y = GELU(x) = x Phi(x) and d = dy/dx = Phi(x) + x phi(x), sharing one exponential (the formulas and the erf's
// source: cpu/gelu.cpp's header)
inline void gelu_and_slope(vf x, vf &y, vf &d) {
    vf u = x * 0.70710678118654752f;
    vf a = u < 0.0f ? -u : u;
    vf t = 1.0f / (1.0f + 0.3275911f * a);
    vf r = 0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f)));
    vf e = exp_nonpositive(-(u * u));
    vf erf_a = 1.0f - r * t * e;
    vf cdf = 0.5f + 0.5f * (u < 0.0f ? -erf_a : erf_a);
    y = x * cdf;
    d = cdf + x * (e * 0.3989422804014327f);
}

// one step of a 16 x 16 transpose: lanes of rows a and b interleaved in groups of G
template <int G>
inline void interleave(vf &a, vf &b) {
    vf lo, hi;
    if constexpr (G == 1) {
        lo = __builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
        hi = __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
    } else if constexpr (G == 2) {
        lo = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
        hi = __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    } else if constexpr (G == 4) {
        lo = __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
        hi = __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    } else {
        lo = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
        hi = __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
    a = lo, b = hi;
}

// a step of transposing 16 rows of 16 floats in registers (G = 1, 2, 4, 8, in turn): rows r and r + G swap
// their off-diagonal G-groups, for every r with bit G clear
template <int G>
inline void transpose_step(vf (&t)[VW]) {
#pragma GCC unroll 16
    for (int r = 0; r < VW; r++)
        if (!(r & G)) interleave<G>(t[r], t[r + G]);
}

// Xt (C, RP) = the R rows of X (C floats each, rows xs floats apart) transposed, zero-padded to RP columns;
// C and RP multiples of 16: 16 x 16 tiles, each transposed in registers
inline void transpose_rows(const float *X, long xs, long R, long RP, long C, float *Xt) {
    for (long j0 = 0; j0 < RP; j0 += VW)
        for (long c0 = 0; c0 < C; c0 += VW) {
            vf t[VW];
#pragma GCC unroll 16
            for (long r = 0; r < VW; r++) t[r] = j0 + r < R ? load(X + (j0 + r) * xs + c0) : splat(0.0f);
            transpose_step<1>(t), transpose_step<2>(t), transpose_step<4>(t), transpose_step<8>(t);
#pragma GCC unroll 16
            for (long r = 0; r < VW; r++) store(Xt + (c0 + r) * RP + j0, t[r]);
        }
}

}  // namespace
