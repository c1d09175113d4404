// The exact GELU and its derivative in one pass, float32 on CPUs (kernels=gelu).
//
//   u = x / sqrt(2),  erf(u) = sign(u) (1 - t r(t) e^{-u^2}),  t = 1 / (1 + p |u|)   (Abramowitz & Stegun 7.1.26,
//                                                                                       |error| <= 1.5e-7)
//   Phi(x) = (1 + erf(u)) / 2,   phi(x) = e^{-x^2/2} / sqrt(2 pi)      (e^{-u^2} = e^{-x^2/2}: one exp for both)
//   y = x Phi(x)                                       GELU
//   d = Phi(x) + x phi(x)                              dy/dx, kept for the backward pass: dx = dy * d
//
// The same erf as PyTorch's vectorised CPU kernels (ATen's Vectorized<float>::erf, which inductor's compiled
// GELU also calls); torch's backward recomputes erf and e^{-x^2/2} from x, where this kernel computes them once,
// in the forward pass. Each element's result depends on its value only (the last, partial vector is computed
// in a padded copy), so results do not depend on the tensor's size, alignment or threads.
//
// Built by attnlab/cpu/gelu.py through attnlab/cpu/build.py (-O3 -march=native, -DCK_NS=<op namespace>).

#include <ATen/core/Tensor.h>  // the Tensor type and its methods only, not every ATen function
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <tuple>

#include "vec.h"  // vf (16 floats), splat, load, store, gelu_and_slope (the formulas above)

#ifndef CK_NS
#error "CK_NS (the op namespace) must be defined"
#endif

namespace {

constexpr int64_t GRAIN = 2048;  // vectors per task (32768 floats): a layer of a small model stays on one thread

// (x) -> (y, d), both contiguous, x's shape
std::tuple<at::Tensor, at::Tensor> gelu(const at::Tensor &input) {
    TORCH_CHECK(input.device().is_cpu() && input.scalar_type() == at::kFloat, "gelu: a float32 CPU tensor");
    const at::Tensor x = input.contiguous();
    at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous), d = at::empty_like(x, at::MemoryFormat::Contiguous);
    const float *xp = x.data_ptr<float>();
    float *yp = y.data_ptr<float>(), *dp = d.data_ptr<float>();
    const int64_t n = x.numel(), full = n / VW;
    at::parallel_for(0, (n + VW - 1) / VW, GRAIN, [&](int64_t b0, int64_t b1) {
        vf yv, dv;
        for (int64_t b = b0; b < std::min(b1, full); ++b) {
            gelu_and_slope(load(xp + b * VW), yv, dv);
            store(yp + b * VW, yv);
            store(dp + b * VW, dv);
        }
        if (b1 > full) {  // the last, partial vector
            const int64_t i = full * VW, m = n - i;
            float xs[VW] = {}, ys[VW], ds[VW];
            std::memcpy(xs, xp + i, m * sizeof(float));
            gelu_and_slope(load(xs), yv, dv);
            store(ys, yv);
            store(ds, dv);
            std::memcpy(yp + i, ys, m * sizeof(float));
            std::memcpy(dp + i, ds, m * sizeof(float));
        }
    });
    return {y, d};
}

}  // namespace

TORCH_LIBRARY(CK_NS, m) {
    m.def("gelu(Tensor x) -> (Tensor, Tensor)");
    m.impl("gelu", c10::DispatchKey::CPU, &gelu);
}
