// The end of a float32 training step on one CPU thread (batch_threads): the parts' gradients summed, their
// norm, and AdamW with the clipping folded in. Each is one pass over the tensors' memory, where torch's
// foreach sum, clip_grad_norm_ (a norm, then a multiplication) and fused AdamW take four.
//
//   plain(xs):          whether every tensor is a contiguous float32 CPU tensor (what the others need)
//   add_(dst, src):     dst_i += src_i                                  (the same sums as torch._foreach_add_)
//   sq_norm(x):         sum_i ||x_i||^2                                 (a double; fixed order, so it repeats)
//   end_part_(...):     all three at once, inside the parts' own threads (below)
//   abort_(sync):       releases the threads waiting in end_part_ (a part failed)
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
// end_part_ runs the step's end on all P parts' threads at once: each part's thread calls it with its part p
// once its gradients g_p are computed, and the threads meet twice on `sync`, a zeroed int64 tensor made for the
// step (the layout is at SYNC below):
//   1. every part has published its gradients (their addresses), whether they fit, and its loss;
//   2. every thread has summed its share of the tensors, g = g_0 + g_1 + .. + g_{P-1} (into g_0, in part order:
//      add_'s sums), and written each tensor's ||g||^2.
// Then each thread computes n = ||g|| (the tensors' sums in list order: sq_norm's number, on every thread) and,
// unless n or the loss sum_p loss_p / P is not finite, AdamW on its share with c = min(1, clip / (n + 1e-6)).
// Thread p's share is run p of runs(params, P), so the results are those of add_, sq_norm and adamw_ on one
// thread, bit for bit. It returns false, having changed nothing, where a part's gradients do not fit (missing,
// another shape, not contiguous float32), or where abort_ was called (a part raised before it got here).
//
// Built by attnlab/cpu/step.py through attnlab/cpu/build.py (-O3 -march=native -fopenmp for the
// simd pragmas, -DCK_NS=<op namespace>).

#include <ATen/core/Tensor.h>  // the Tensor type and its methods only, not every ATen function
#include <torch/library.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "vec.h"  // vf (16 floats), VW, load

#ifndef CK_NS
#error "CK_NS (the op namespace) must be defined"
#endif

namespace {

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

// runs(xs, P): the P + 1 boundaries of P runs of consecutive tensors [b_r, b_{r+1}) holding about numel / P
// elements each (a tensor goes to the run its middle falls in; a run may be empty).
std::vector<size_t> runs(const std::vector<at::Tensor> &xs, int64_t parts) {
    int64_t total = 0, seen = 0;
    for (const auto &t : xs) total += t.numel();
    std::vector<size_t> bounds{0};
    size_t i = 0;
    for (int64_t r = 1; r < parts; ++r) {
        while (i < xs.size() && seen + xs[i].numel() / 2 < total * r / parts) seen += xs[i++].numel();
        bounds.push_back(i);
    }
    bounds.push_back(xs.size());
    return bounds;
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

// ||x||^2 of n floats: 16 running sums (lane j adds elements j, j + 16, ..), then the lanes and the tail in double
double sq_norm_one(const float *x, int64_t n) {
    const int64_t body = n / VW * VW;
    vf acc = {};
    for (int64_t i = 0; i < body; i += VW) {
        vf v = load(x + i);
        acc += v * v;
    }
    double sum = 0;
    for (int64_t j = 0; j < VW; ++j) sum += acc[j];
    for (int64_t i = body; i < n; ++i) sum += double(x[i]) * x[i];
    return sum;
}

double sq_norm(std::vector<at::Tensor> xs) {
    double total = 0;
    for (const auto &t : xs) {
        check(t, "sq_norm");
        total += sq_norm_one(t.data_ptr<float>(), t.numel());
    }
    return total;
}

// AdamW on one tensor, its step counter incremented first, with the gradient g * c.
void adamw_one(const at::Tensor &param, const float *g, const at::Tensor &exp_avg, const at::Tensor &exp_avg_sq,
               const at::Tensor &step, double lr, double beta1, double beta2, double weight_decay, double eps,
               double grad_factor) {
    float *count = step.data_ptr<float>();
    *count += 1;
    const double steps = *count;
    const float decay = 1 - lr * weight_decay, b1 = 1 - beta1, b2 = beta2, one_b2 = 1 - beta2;
    const float step_size = lr / (1 - std::pow(beta1, steps));
    const float bc2_sqrt = std::sqrt(1 - std::pow(beta2, steps)), e = eps, c = grad_factor;
    float *w = param.data_ptr<float>(), *m = exp_avg.data_ptr<float>(), *v = exp_avg_sq.data_ptr<float>();
    const int64_t n = param.numel();
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

void check_state(const std::vector<at::Tensor> &param, const std::vector<at::Tensor> &exp_avg,
                 const std::vector<at::Tensor> &exp_avg_sq, const std::vector<at::Tensor> &step, const char *what) {
    check_pairs(param, exp_avg, what);
    check_pairs(param, exp_avg_sq, what);
    TORCH_CHECK(step.size() == param.size(), what, ": one step counter per parameter");
    for (const auto &s : step) {
        TORCH_CHECK(s.numel() == 1, what, ": the step counters are single numbers");
        check(s, what);
    }
}

void adamw_(std::vector<at::Tensor> param, std::vector<at::Tensor> grad, std::vector<at::Tensor> exp_avg,
            std::vector<at::Tensor> exp_avg_sq, std::vector<at::Tensor> step, double lr, double beta1, double beta2,
            double weight_decay, double eps, double grad_factor) {
    check_pairs(param, grad, "adamw_");
    check_state(param, exp_avg, exp_avg_sq, step, "adamw_");
    for (size_t t = 0; t < param.size(); ++t)
        adamw_one(param[t], grad[t].data_ptr<float>(), exp_avg[t], exp_avg_sq[t], step[t], lr, beta1, beta2,
                  weight_decay, eps, grad_factor);
}

// ---- the step's end inside the parts' threads ----

// SYNC: the int64 slots of end_part_'s `sync` tensor, for P parts and n parameters (doubles stored bit for bit)
enum : int64_t { ARRIVED, SUMMED, ABORTED, UNFIT, NORM, HEADER };  // then P losses, n squared norms, P x n addresses
int64_t sync_size(int64_t parts, int64_t n) { return HEADER + parts + n + parts * n; }

void put_double(int64_t *slot, double x) { std::memcpy(slot, &x, sizeof x); }
double get_double(const int64_t *slot) { double x; std::memcpy(&x, slot, sizeof x); return x; }

// Counts this thread in at slot `counter` and waits until all `parts` are: true, or false once abort_ was called.
// It spins for up to 2 ms (the parts finish within a few tenths of one another), then sleeps between looks (a
// part may still be compiling its graphs on the first step).
bool meet(int64_t *sync, int64_t counter, int64_t parts) {
    __atomic_fetch_add(&sync[counter], 1, __ATOMIC_ACQ_REL);
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(2);
    while (__atomic_load_n(&sync[counter], __ATOMIC_ACQUIRE) < parts) {
        if (__atomic_load_n(&sync[ABORTED], __ATOMIC_ACQUIRE)) return false;
        if (std::chrono::steady_clock::now() > spin_until) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return true;
}

void abort_(at::Tensor sync) {
    TORCH_CHECK(sync.device().is_cpu() && sync.scalar_type() == at::kLong && sync.is_contiguous() &&
                sync.numel() > ABORTED, "abort_: sync must be end_part_'s int64 tensor");
    __atomic_store_n(&sync.data_ptr<int64_t>()[ABORTED], 1, __ATOMIC_RELEASE);
}

bool fits(const std::vector<at::Tensor> &grads, const std::vector<at::Tensor> &params) {
    if (grads.size() != params.size()) return false;
    for (size_t t = 0; t < grads.size(); ++t)
        if (!plain({grads[t]}) || grads[t].numel() != params[t].numel()) return false;
    return true;
}

bool end_part_(at::Tensor sync_, int64_t part, int64_t parts, std::vector<at::Tensor> param,
               std::vector<at::Tensor> grad, std::vector<at::Tensor> exp_avg, std::vector<at::Tensor> exp_avg_sq,
               std::vector<at::Tensor> step, std::vector<double> lr, std::vector<double> beta1,
               std::vector<double> beta2, std::vector<double> weight_decay, std::vector<double> eps, double max_norm,
               double loss) {
    const int64_t n = param.size();
    TORCH_CHECK(0 <= part && part < parts, "end_part_: part ", part, " of ", parts);
    TORCH_CHECK(sync_.device().is_cpu() && sync_.scalar_type() == at::kLong && sync_.is_contiguous() &&
                sync_.numel() == sync_size(parts, n), "end_part_: sync must be a zeroed int64 tensor of ",
                sync_size(parts, n), " elements");
    for (const auto &p : param) check(p, "end_part_'s parameters");
    check_state(param, exp_avg, exp_avg_sq, step, "end_part_");
    for (const auto *h : {&lr, &beta1, &beta2, &weight_decay, &eps})
        TORCH_CHECK((int64_t)h->size() == n, "end_part_: one learning rate, beta1, beta2, weight decay, eps per tensor");
    int64_t *sync = sync_.data_ptr<int64_t>(), *losses = sync + HEADER, *sq = losses + parts, *addr = sq + n;

    // 1. publish this part's gradients and loss, then wait for every part's
    const bool fit = fits(grad, param);
    if (!fit) __atomic_fetch_add(&sync[UNFIT], 1, __ATOMIC_ACQ_REL);
    for (int64_t t = 0; fit && t < n; ++t) addr[part * n + t] = (int64_t)grad[t].data_ptr<float>();
    put_double(&losses[part], loss);
    if (!meet(sync, ARRIVED, parts) || __atomic_load_n(&sync[UNFIT], __ATOMIC_ACQUIRE)) return false;

    // 2. this thread's share: g = g_0 + g_1 + .. (into g_0) and ||g||^2 per tensor
    const std::vector<size_t> share = runs(param, parts);
    for (size_t t = share[part]; t < share[part + 1]; ++t) {
        float *g = (float *)addr[t];
        const int64_t len = param[t].numel();
        for (int64_t q = 1; q < parts; ++q) {
            const float *h = (const float *)addr[q * n + t];
#pragma omp simd
            for (int64_t i = 0; i < len; ++i) g[i] += h[i];
        }
        put_double(&sq[t], sq_norm_one(g, len));
    }
    if (!meet(sync, SUMMED, parts)) return false;

    // 3. the norm and the loss, the same on every thread; AdamW on this thread's share unless one is not finite
    double total = 0;
    for (int64_t t = 0; t < n; ++t) total += get_double(&sq[t]);
    const float norm = std::sqrt(total);  // as clip_grad_norm_'s float32 norm
    if (part == 0) put_double(&sync[NORM], norm);
    float mean_loss = 0;
    for (int64_t q = 0; q < parts; ++q) mean_loss += (float)get_double(&losses[q]) / (float)parts;
    if (!std::isfinite(norm) || !std::isfinite(mean_loss)) return true;  // a skipped step: nothing updated
    const double factor = max_norm != 0 ? std::min(1.0, max_norm / ((double)norm + 1e-6)) : 1.0;  // clip_factor
    for (size_t t = share[part]; t < share[part + 1]; ++t)
        adamw_one(param[t], (const float *)addr[t], exp_avg[t], exp_avg_sq[t], step[t], lr[t], beta1[t], beta2[t],
                  weight_decay[t], eps[t], factor);
    return true;
}

}  // namespace

TORCH_LIBRARY(CK_NS, m) {
    m.def("plain(Tensor[] xs) -> bool", &plain);
    m.def("add_(Tensor(a!)[] dst, Tensor[] src) -> ()", &add_);
    m.def("sq_norm(Tensor[] xs) -> float", &sq_norm);
    m.def("adamw_(Tensor(a!)[] param, Tensor[] grad, Tensor(b!)[] exp_avg, Tensor(c!)[] exp_avg_sq, "
          "Tensor(d!)[] step, float lr, float beta1, float beta2, float weight_decay, float eps, float grad_factor) "
          "-> ()", &adamw_);
    m.def("end_part_(Tensor(a!) sync, int part, int parts, Tensor(b!)[] param, Tensor(c!)[] grad, "
          "Tensor(d!)[] exp_avg, Tensor(e!)[] exp_avg_sq, Tensor(f!)[] step, float[] lr, float[] beta1, "
          "float[] beta2, float[] weight_decay, float[] eps, float max_norm, float loss) -> bool", &end_part_);
    m.def("abort_(Tensor(a!) sync) -> ()", &abort_);
}
