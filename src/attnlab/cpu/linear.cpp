// The three float32 products of a linear layer without bias on CPUs (kernels=linear):
//
//   forward       y  (M, N) = x (M, K) W^T         W (N, K): out_features x in_features
//   grad input    dx (M, K) = dy (M, N) W
//   grad weight   dW (N, K) = dy^T x
//
// Each is one loop, C (R, S) = sum_k a(r, k) B[k, :], with a(r, k) = A[r * ar + k * ak] read one float at a time
// and broadcast, and the rows B[k, :] read as vectors:
//
//   forward       a = x      (ar = K, ak = 1),  B = W^T (K, N), transposed here in 16 x 16 register tiles
//   grad input   a = dy     (ar = N, ak = 1),  B = W   (N, K), as it is
//   grad weight   a = dy^T   (ar = 1, ak = N),  B = x   (M, K), as it is
//
// C is computed in tiles of RT rows by 64 columns (RT x 4 vectors of 16 floats held in registers for the whole
// sum over k: each B vector loaded is used RT times, each a(r, k) 4 times); S must be a multiple of 16 (the
// last tile of a row may be 16, 32 or 48 wide). Only the forward operand is copied (W^T, N x K floats); BLAS
// libraries pack both operands into blocks first, which at these sizes (K of 128-512, a few hundred rows)
// costs them more than it saves: nanoGPT's model spends ~12% of MKL's time in its packing and scaling.
// Floats are summed over k in order, one accumulator per output, so results differ from a BLAS's in the last
// bits only. linear_gelu applies the exact GELU (and its slope, for the backward pass) to each tile as it leaves
// the registers, so an FFN's first layer and its activation make one pass over the hidden activations, not three.
//
// Built by attnlab/cpu/linear.py with -O3 -march=native and -DCK_NS=<op namespace>; GCC's vector
// extensions give AVX-512 code where the CPU has it, narrower vectors elsewhere.

#include <ATen/core/Tensor.h>  // the Tensor type and its methods only, not every ATen function
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <utility>

#include "vec.h"  // vf (16 floats), splat, load, store, transpose_rows, gelu_and_slope

#ifndef CK_NS
#error "CK_NS (the op namespace) must be defined"
#endif

namespace {

constexpr long RT = 6;                  // rows per tile
constexpr long NV = 4;                  // vectors per tile row: 64 columns
constexpr long TILE_ROWS_PER_TASK = 8;  // a task of the thread pool: 48 rows by one 64-column panel

// C[r, 0 : 16 V] = sum_{k < Kd} a(r, k) B[k, 0 : 16 V] for r < R; with D, C = GELU of that sum and D its slope
template <int R, int V>
inline void tile(const float *A, long ar, long ak, const float *B, long bs, long Kd, float *C, long cs, float *D) {
    vf c[R][V];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) c[r][v] = splat(0.0f);
    for (long k = 0; k < Kd; k++) {
        vf b[V];
        for (int v = 0; v < V; v++) b[v] = load(B + k * bs + v * VW);
        for (int r = 0; r < R; r++) {
            const float a = A[r * ar + k * ak];
            for (int v = 0; v < V; v++) c[r][v] += a * b[v];
        }
    }
    if (D != nullptr) {
        for (int r = 0; r < R; r++)
            for (int v = 0; v < V; v++) {
                vf y, d;
                gelu_and_slope(c[r][v], y, d);
                store(C + r * cs + v * VW, y), store(D + r * cs + v * VW, d);
            }
        return;
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < V; v++) store(C + r * cs + v * VW, c[r][v]);
}

// the last R < RT rows of a panel: the tile for exactly R rows
template <int V, int R = RT - 1>
inline void short_tile(long rows, const float *A, long ar, long ak, const float *B, long bs, long Kd, float *C,
                       long cs, float *D) {
    if constexpr (R > 0) {
        if (rows == R) return tile<R, V>(A, ar, ak, B, bs, Kd, C, cs, D);
        short_tile<V, R - 1>(rows, A, ar, ak, B, bs, Kd, C, cs, D);
    }
}

// rows r0 .. r1 - 1 of one panel of C, 16 V columns from column j
template <int V>
void panel(long r0, long r1, long j, const float *A, long ar, long ak, const float *B, long bs, long Kd, float *C,
           long cs, float *D) {
    long r = r0;
    for (; r + RT <= r1; r += RT)
        tile<RT, V>(A + r * ar, ar, ak, B + j, bs, Kd, C + r * cs + j, cs, D ? D + r * cs + j : nullptr);
    if (r < r1)
        short_tile<V>(r1 - r, A + r * ar, ar, ak, B + j, bs, Kd, C + r * cs + j, cs, D ? D + r * cs + j : nullptr);
}

// C (R, S) = sum_k a(r, k) B[k, :]: tasks of up to 48 rows by one panel (64 columns, or the 16-48 left over);
// with D (R, S), C = GELU of the sums and D their slopes (the epilogue of an FFN's first layer)
void product(const float *A, long ar, long ak, const float *B, long bs, long R, long Kd, long S, float *C,
             float *D = nullptr) {
    const long rows_per_task = RT * TILE_ROWS_PER_TASK, row_tasks = (R + rows_per_task - 1) / rows_per_task;
    const long panels = (S + NV * VW - 1) / (NV * VW);
    at::parallel_for(0, row_tasks * panels, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; t++) {
            const long p = t / row_tasks, r0 = (t % row_tasks) * rows_per_task;
            const long r1 = std::min(R, r0 + rows_per_task), j = p * NV * VW, width = std::min(NV * VW, S - j);
            switch (width / VW) {
                case 4: panel<4>(r0, r1, j, A, ar, ak, B, bs, Kd, C, S, D); break;
                case 3: panel<3>(r0, r1, j, A, ar, ak, B, bs, Kd, C, S, D); break;
                case 2: panel<2>(r0, r1, j, A, ar, ak, B, bs, Kd, C, S, D); break;
                default: panel<1>(r0, r1, j, A, ar, ak, B, bs, Kd, C, S, D);
            }
        }
    });
}

// a and b, checked (2-D float32 CPU, a's dimension ad the length of b's bd, the `what` they share) and contiguous
std::pair<at::Tensor, at::Tensor> operands(const at::Tensor &a, const char *an, long ad, const at::Tensor &b,
                                           const char *bn, long bd, const char *what) {
    for (auto [t, name] : {std::pair{&a, an}, std::pair{&b, bn}})
        TORCH_CHECK(t->device().is_cpu() && t->scalar_type() == at::kFloat && t->dim() == 2, "cpu-fused linear: ",
                    name, " must be a 2-D float32 CPU tensor, got ", t->scalar_type(), " ", t->sizes());
    TORCH_CHECK(a.size(ad) == b.size(bd), "cpu-fused linear: ", an, " ", a.sizes(), " and ", bn, " ", b.sizes(),
                " differ in ", what);
    return {a.contiguous(), b.contiguous()};
}

void check_width(long width, const char *name) {
    TORCH_CHECK(width % VW == 0, "cpu-fused linear: ", name, " (", width, ") must be a multiple of ", VW);
}

// y = x W^T, x (M, K), W (N, K) -> (M, N); with d, y = GELU(x W^T) and d its slope
at::Tensor forward(const at::Tensor &x_, const at::Tensor &w_, bool gelu, at::Tensor *d) {
    const auto [x, w] = operands(x_, "x", 1, w_, "weight", 1, "K");
    const long M = x.size(0), K = x.size(1), N = w.size(0);
    check_width(N, "out_features"), check_width(K, "in_features");
    auto y = at::empty({M, N}, x.options());
    if (gelu) *d = at::empty({M, N}, x.options());
    if (M == 0) return y;
    auto wt = at::empty({K, N}, x.options());
    transpose_rows(w.data_ptr<float>(), K, N, N, K, wt.data_ptr<float>());  // W^T (K, N)
    product(x.data_ptr<float>(), K, 1, wt.data_ptr<float>(), N, M, K, N, y.data_ptr<float>(),
            gelu ? d->data_ptr<float>() : nullptr);
    return y;
}

at::Tensor linear(const at::Tensor &x, const at::Tensor &w) { return forward(x, w, false, nullptr); }

// (GELU(x W^T), its slope): an FFN's first layer and its activation in one pass
std::tuple<at::Tensor, at::Tensor> linear_gelu(const at::Tensor &x, const at::Tensor &w) {
    at::Tensor d;
    at::Tensor y = forward(x, w, true, &d);
    return {y, d};
}

// dx = dy W: dy (M, N), W (N, K) -> (M, K)
at::Tensor linear_grad_input(const at::Tensor &g_, const at::Tensor &w_) {
    const auto [g, w] = operands(g_, "grad", 1, w_, "weight", 0, "N");
    check_width(w.size(1), "in_features");
    auto dx = at::empty({g.size(0), w.size(1)}, g.options());
    if (g.size(0) > 0)
        product(g.data_ptr<float>(), g.size(1), 1, w.data_ptr<float>(), w.size(1), g.size(0), g.size(1), w.size(1),
                dx.data_ptr<float>());
    return dx;
}

// dW = dy^T x: dy (M, N), x (M, K) -> (N, K); no rows: zeros
at::Tensor linear_grad_weight(const at::Tensor &g_, const at::Tensor &x_) {
    const auto [g, x] = operands(g_, "grad", 0, x_, "x", 0, "M");
    check_width(x.size(1), "in_features");
    if (g.size(0) == 0) return at::zeros({g.size(1), x.size(1)}, g.options());
    auto dw = at::empty({g.size(1), x.size(1)}, g.options());
    product(g.data_ptr<float>(), 1, g.size(1), x.data_ptr<float>(), x.size(1), g.size(1), g.size(0), x.size(1),
            dw.data_ptr<float>());
    return dw;
}

}  // namespace

TORCH_LIBRARY(CK_NS, m) {
    m.def("linear(Tensor x, Tensor weight) -> Tensor");
    m.def("linear_gelu(Tensor x, Tensor weight) -> (Tensor, Tensor)");
    m.def("linear_grad_input(Tensor grad, Tensor weight) -> Tensor");
    m.def("linear_grad_weight(Tensor grad, Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(CK_NS, CPU, m) {
    m.impl("linear", &linear);
    m.impl("linear_gelu", &linear_gelu);
    m.impl("linear_grad_input", &linear_grad_input);
    m.impl("linear_grad_weight", &linear_grad_weight);
}
