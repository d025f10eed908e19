// RMSNorm over the last dimension of float32 CPU tensors, forward and backward, as the op torch.ops.zoo.rms_norm
// with its own autograd (zoo/kernels/norm.py applies it to RMSNorm; torch has no fused RMSNorm on CPU).
//
//   y = x * rstd * w,   rstd = 1 / sqrt(mean(x^2) + eps)                       (each row of d numbers)
//   dx = rstd * g * w - x * (rstd^3 / d) * sum(g * w * x),   dw = sum over rows of g * x * rstd
//
// Rows are shared between torch's threads (at::parallel_for). Every sum has a fixed order whatever the thread
// count or the CPU: within a row, L independent lanes added up at the end (vectorised without reordering an
// addition; built with fused multiply-adds off); dw, over fixed blocks of rows added up in block order.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <cmath>

namespace {

constexpr int64_t L = 16;          // lanes of a row's sums
constexpr int64_t BLOCK = 64;      // rows of one partial dw

// One row each way; __restrict__: the rows never overlap, so the compiler vectorises without checking.
float row_forward(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y, int64_t d,
                  float eps) {
    float acc[L] = {0};  // sum of x^2 in L lanes
    int64_t j = 0;
    for (; j + L <= d; j += L)
        for (int64_t k = 0; k < L; k++) acc[k] += x[j + k] * x[j + k];
    float ss = 0.0f;
    for (int64_t k = 0; k < L; k++) ss += acc[k];
    for (; j < d; j++) ss += x[j] * x[j];
    const float rs = 1.0f / std::sqrt(ss / d + eps);
    for (j = 0; j < d; j++) y[j] = x[j] * rs * w[j];
    return rs;
}

void row_backward(const float* __restrict__ g, const float* __restrict__ x, const float* __restrict__ w, float rs,
                  float* __restrict__ dx, float* __restrict__ dw, int64_t d) {
    float acc[L] = {0};  // sum of g * w * x in L lanes
    int64_t j = 0;
    for (; j + L <= d; j += L)
        for (int64_t k = 0; k < L; k++) acc[k] += g[j + k] * w[j + k] * x[j + k];
    float dot = 0.0f;
    for (int64_t k = 0; k < L; k++) dot += acc[k];
    for (; j < d; j++) dot += g[j] * w[j] * x[j];
    const float c = rs * rs * rs * dot / d;
    for (j = 0; j < d; j++) {
        dx[j] = rs * g[j] * w[j] - x[j] * c;
        dw[j] += g[j] * x[j] * rs;
    }
}

void check(const at::Tensor& x, const at::Tensor& w) {
    TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
                "zoo::rms_norm: float32 CPU tensors only, got ", x.scalar_type(), " on ", x.device());
    TORCH_CHECK(w.dim() == 1 && x.dim() >= 1 && w.size(0) == x.size(-1), "zoo::rms_norm: weight of shape ",
                w.sizes(), " does not match the last dimension of ", x.sizes());
}

std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x_, const at::Tensor& w_, double eps) {
    check(x_, w_);
    at::Tensor x = x_.contiguous(), w = w_.contiguous();
    const int64_t d = x.size(-1), rows = x.numel() / std::max<int64_t>(d, 1);
    at::Tensor y = at::empty_like(x), rstd = at::empty({rows}, x.options());
    const float *xp = x.const_data_ptr<float>(), *wp = w.const_data_ptr<float>();
    float *yp = y.data_ptr<float>(), *rp = rstd.data_ptr<float>();
    const float e = static_cast<float>(eps);
    at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1)), [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r++) rp[r] = row_forward(xp + r * d, wp, yp + r * d, d, e);
    });
    return {y, rstd};
}

std::tuple<at::Tensor, at::Tensor> backward(const at::Tensor& g_, const at::Tensor& x, const at::Tensor& w,
                                            const at::Tensor& rstd) {
    at::Tensor g = g_.contiguous();
    const int64_t d = x.size(-1), rows = rstd.numel(), blocks = (rows + BLOCK - 1) / BLOCK;
    at::Tensor dx = at::empty_like(x), parts = at::zeros({blocks, d}, x.options());
    const float *gp = g.const_data_ptr<float>(), *xp = x.const_data_ptr<float>(), *wp = w.const_data_ptr<float>();
    const float* rp = rstd.const_data_ptr<float>();
    float *dxp = dx.data_ptr<float>(), *pp = parts.data_ptr<float>();
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
        for (int64_t b = b0; b < b1; b++) {
            float* dw = pp + b * d;
            for (int64_t r = b * BLOCK; r < std::min(rows, (b + 1) * BLOCK); r++)
                row_backward(gp + r * d, xp + r * d, wp, rp[r], dxp + r * d, dw, d);
        }
    });
    at::Tensor dw = at::zeros({d}, x.options());  // the blocks' partial sums, added up in block order
    float* dwp = dw.data_ptr<float>();
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t j = 0; j < d; j++) dwp[j] += pp[b * d + j];
    return {dx, dw};
}

struct RMSNorm : public torch::autograd::Function<RMSNorm> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_, const at::Tensor& w_,
                              double eps) {
        at::Tensor x = x_.contiguous(), w = w_.contiguous();
        auto [y, rstd] = ::forward(x, w, eps);
        ctx->save_for_backward({x, w, rstd});
        return y;
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        TORCH_CHECK(!at::GradMode::is_enabled(), "zoo::rms_norm has no second derivative; kernels=none uses torch's "
                    "formula, which has");  // create_graph=True: the kernels below would record nothing
        auto saved = ctx->get_saved_variables();
        auto [dx, dw] = ::backward(grads[0], saved[0], saved[1], saved[2]);
        return {dx, dw, at::Tensor()};
    }
};

at::Tensor rms_norm_autograd(const at::Tensor& x, const at::Tensor& w, double eps) {
    return RMSNorm::apply(x, w, eps);
}

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& w, double eps) {  // inference mode: no graph
    return std::get<0>(forward(x, w, eps));
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zoo, m) { m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor"); }
TORCH_LIBRARY_IMPL(zoo, Autograd, m) { m.impl("rms_norm", &rms_norm_autograd); }
TORCH_LIBRARY_IMPL(zoo, CPU, m) { m.impl("rms_norm", &rms_norm_cpu); }
