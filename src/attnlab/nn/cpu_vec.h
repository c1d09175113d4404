// Vectors of 16 floats for attnlab's C++ CPU kernels (GCC/Clang vector extensions: AVX-512 code where the CPU
// has it, narrower vectors elsewhere), and e^x for x <= 0.
//
//   e^x = 2^n e^r,  x = n ln2 + r (Cody-Waite: ln2 in two parts), |r| <= ln2/2,
//   e^r by its Taylor polynomial of degree 6 (relative error ~1e-7, like the float32 exp); 2^n from its bits.
//   x is clamped at -87 (e^-87 ~ 1.6e-38, the smallest normal float's order), so the result is never subnormal.
//
// Included by nn/attention/cpu_fused.cpp, nn/gelu_cpu.cpp and training/cpu_step.cpp; nn/cpp_build.py keys their
// builds on this file's text too.

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

}  // namespace
