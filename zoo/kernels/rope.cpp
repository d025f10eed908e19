// RoPE's rotation of queries or keys on CPU, forward and backward in one pass each, as the op torch.ops.zoo.rope
// with its own autograd (zoo/kernels/position.py applies it to RoPE). Written as torch ops, the rotation
// is eleven small kernels and a cast of the table each way, per layer, which at short contexts cost more than the
// attention around them.
//
// Half-split layout, as RotaryPosition: for x of d numbers, x1 its first half and x2 its second,
//   forward   y1 = x1 * c1 - x2 * s1,   y2 = x2 * c2 + x1 * s2          (cos, sin: one row of d per position)
//   backward  g1 = y1 * c1 + y2 * s2,   g2 = y2 * c2 - y1 * s1          (the transpose of that linear map)
// computed in float32 whatever x's dtype (float32, bf16, fp16), rounded once. In float32 the operations and their
// order are the formula's (x * cos + cat(-x2, x1) * sin), so the values are the same bits.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

namespace {

// x (B, H, T, d) with any strides but a contiguous last dimension -> a new contiguous (B, H, T, d)
at::Tensor rotate(const at::Tensor& x_, const at::Tensor& cos, const at::Tensor& sin, bool backward) {
    TORCH_CHECK(x_.dim() == 4 && x_.device().is_cpu(), "zoo::rope: a (B, H, T, d) CPU tensor, got ", x_.sizes());
    TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.size(0) == x_.size(2) &&
                    cos.size(1) == x_.size(3) && sin.sizes() == cos.sizes() && cos.stride(1) == 1 && sin.stride(1) == 1,
                "zoo::rope: cos and sin must be float32 (T, d) tables with rows of d, got ", cos.sizes());
    at::Tensor x = x_.stride(3) == 1 ? x_ : x_.contiguous();
    const int64_t B = x.size(0), H = x.size(1), T = x.size(2), d = x.size(3), h = d / 2;
    TORCH_CHECK(d % 2 == 0, "zoo::rope: an even size to rotate, got ", d);
    at::Tensor y = at::empty({B, H, T, d}, x.options());
    const int64_t sb = x.stride(0), sh = x.stride(1), st = x.stride(2), cs = cos.stride(0), ss = sin.stride(0);
    const float sign = backward ? -1.0f : 1.0f;
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "zoo::rope", [&] {
        const scalar_t* xp = x.const_data_ptr<scalar_t>();
        scalar_t* yp = y.data_ptr<scalar_t>();
        const float *cp = cos.const_data_ptr<float>(), *sp = sin.const_data_ptr<float>();
        at::parallel_for(0, B * H * T, std::max<int64_t>(1, 8192 / d), [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; r++) {
                const int64_t b = r / (H * T), hh = (r / T) % H, t = r % T;
                const scalar_t* __restrict__ xr = xp + b * sb + hh * sh + t * st;
                scalar_t* __restrict__ yr = yp + r * d;
                const float *__restrict__ c = cp + t * cs, *__restrict__ s = sp + t * ss;
                // forward: the second half's sine enters the first half negated; backward: the other way round
                const float *s_first = backward ? s + h : s, *s_second = backward ? s : s + h;
                for (int64_t i = 0; i < h; i++) {
                    const float a = static_cast<float>(xr[i]), e = static_cast<float>(xr[i + h]);
                    yr[i] = static_cast<scalar_t>(a * c[i] + -(sign * e) * s_first[i]);
                    yr[i + h] = static_cast<scalar_t>(e * c[i + h] + sign * a * s_second[i]);
                }
            }
        });
    });
    return y;
}

struct Rope : public torch::autograd::Function<Rope> {
    static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                              const at::Tensor& sin) {
        ctx->save_for_backward({cos, sin});
        return rotate(x, cos, sin, false);
    }

    static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                   torch::autograd::variable_list grads) {
        TORCH_CHECK(!at::GradMode::is_enabled(), "zoo::rope has no second derivative; kernels=none uses torch's "
                    "formula, which has");  // create_graph=True: the kernel below would record nothing
        auto saved = ctx->get_saved_variables();
        return {rotate(grads[0], saved[0], saved[1], true), at::Tensor(), at::Tensor()};
    }
};

at::Tensor rope_autograd(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    return Rope::apply(x, cos, sin);
}

at::Tensor rope_cpu(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {  // inference mode
    return rotate(x, cos, sin, false);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(zoo, m) { m.def("rope(Tensor x, Tensor cos, Tensor sin) -> Tensor"); }
TORCH_LIBRARY_IMPL(zoo, Autograd, m) { m.impl("rope", &rope_autograd); }
TORCH_LIBRARY_IMPL(zoo, CPU, m) { m.impl("rope", &rope_cpu); }
