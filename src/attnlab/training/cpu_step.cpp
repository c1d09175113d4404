// The end of a float32 training step on one CPU thread (batch_threads): the parts' gradients summed, their
// norm, and AdamW with the clipping folded in. Each is one pass over the tensors' memory, where torch's
// foreach sum, clip_grad_norm_ (a norm, then a multiplication) and fused AdamW take four.
//
//   plain(xs):          whether every tensor is a contiguous float32 CPU tensor (what the others need)
//   add_(dst, src):     dst_i += src_i                                  (the same sums as torch._foreach_add_)
//   sq_norm(x):         sum_i ||x_i||^2                                 (a double; fixed order, so it repeats)
//   adamw_(...):        for each tensor, with its step counter t incremented first and g = c * grad:
//                         theta <- theta (1 - lr wd)
//                         m <- m + (1 - beta1) (g - m)
//                         v <- beta2 v + (1 - beta2) g^2
//                         theta <- theta - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// adamw_ is torch.optim.AdamW's update (decoupled weight decay, no amsgrad), in the same order of operations as
// torch's fused CPU kernel, on the optimiser's own state tensors; c is the clipping coefficient
// min(1, clip / (||g|| + 1e-6)) that clip_grad_norm_ would multiply the gradients by. Every tensor must be a
// contiguous float32 CPU tensor (the step counters 0-d float32). Elementwise loops run in a fixed order: the
// results do not depend on the tensors' alignment or on the thread.
//
// Built by attnlab/training/cpu_step.py through attnlab/nn/cpp_build.py (-O3 -march=native -fopenmp for the
// simd pragmas, -DCK_NS=<op namespace>).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#ifndef CK_NS
#error "CK_NS (the op namespace) must be defined"
#endif

namespace {

constexpr int64_t VW = 16;  // floats per vector
typedef float vf __attribute__((vector_size(64)));

inline vf load(const float *p) { vf v; std::memcpy(&v, p, sizeof v); return v; }

void check(const at::Tensor &t, const char *what) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(),
                what, " must be contiguous float32 CPU tensors");
}

void check_pairs(const std::vector<at::Tensor> &a, const std::vector<at::Tensor> &b, const char *what) {
    TORCH_CHECK(a.size() == b.size(), what, ": lists of different lengths");
    for (size_t i = 0; i < a.size(); ++i) {
        check(a[i], what);
        check(b[i], what);
        TORCH_CHECK(a[i].numel() == b[i].numel(), what, ": tensor ", i, " differs in size");
    }
}

bool plain(std::vector<at::Tensor> xs) {
    for (const auto &t : xs)
        if (!t.defined() || !t.device().is_cpu() || t.scalar_type() != at::kFloat || !t.is_contiguous()) return false;
    return true;
}

void add_(std::vector<at::Tensor> dst, std::vector<at::Tensor> src) {
    check_pairs(dst, src, "add_");
    for (size_t t = 0; t < dst.size(); ++t) {
        float *x = dst[t].data_ptr<float>();
        const float *y = src[t].data_ptr<float>();
        const int64_t n = dst[t].numel();
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) x[i] += y[i];
    }
}

double sq_norm(std::vector<at::Tensor> xs) {
    double total = 0;
    for (const auto &t : xs) {
        check(t, "sq_norm");
        const float *x = t.data_ptr<float>();
        const int64_t n = t.numel(), body = n / VW * VW;
        vf acc = {};  // 16 running sums: lane j adds elements j, j + 16, j + 32, ..
        for (int64_t i = 0; i < body; i += VW) {
            vf v = load(x + i);
            acc += v * v;
        }
        double sum = 0;
        for (int64_t j = 0; j < VW; ++j) sum += acc[j];
        for (int64_t i = body; i < n; ++i) sum += double(x[i]) * x[i];
        total += sum;
    }
    return total;
}

void adamw_(std::vector<at::Tensor> param, std::vector<at::Tensor> grad, std::vector<at::Tensor> exp_avg,
            std::vector<at::Tensor> exp_avg_sq, std::vector<at::Tensor> step, double lr, double beta1, double beta2,
            double weight_decay, double eps, double grad_factor) {
    check_pairs(param, grad, "adamw_");
    check_pairs(param, exp_avg, "adamw_");
    check_pairs(param, exp_avg_sq, "adamw_");
    TORCH_CHECK(step.size() == param.size(), "adamw_: one step counter per parameter");
    for (size_t t = 0; t < param.size(); ++t) {
        TORCH_CHECK(step[t].numel() == 1, "adamw_: the step counters are single numbers");
        check(step[t], "adamw_'s step counters");
        float *count = step[t].data_ptr<float>();
        *count += 1;
        const double steps = *count;
        const float decay = 1 - lr * weight_decay, b1 = 1 - beta1, b2 = beta2, one_b2 = 1 - beta2;
        const float step_size = lr / (1 - std::pow(beta1, steps));
        const float bc2_sqrt = std::sqrt(1 - std::pow(beta2, steps)), e = eps, c = grad_factor;
        float *w = param[t].data_ptr<float>(), *m = exp_avg[t].data_ptr<float>(), *v = exp_avg_sq[t].data_ptr<float>();
        const float *g = grad[t].data_ptr<float>();
        const int64_t n = param[t].numel();
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
            const float gi = g[i] * c;
            const float mi = m[i] + b1 * (gi - m[i]);
            const float vi = b2 * v[i] + one_b2 * gi * gi;
            m[i] = mi;
            v[i] = vi;
            w[i] = w[i] * decay - step_size * mi / (std::sqrt(vi) / bc2_sqrt + e);
        }
    }
}

}  // namespace

TORCH_LIBRARY(CK_NS, m) {
    m.def("plain(Tensor[] xs) -> bool", &plain);
    m.def("add_(Tensor(a!)[] dst, Tensor[] src) -> ()", &add_);
    m.def("sq_norm(Tensor[] xs) -> float", &sq_norm);
    m.def("adamw_(Tensor(a!)[] param, Tensor[] grad, Tensor(b!)[] exp_avg, Tensor(c!)[] exp_avg_sq, "
          "Tensor(d!)[] step, float lr, float beta1, float beta2, float weight_decay, float eps, float grad_factor) "
          "-> ()", &adamw_);
}
