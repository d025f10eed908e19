// Attention's softmax on CPU for bf16 scores, forward and backward in one pass each, as the ops
// torch.ops.zoo.attention_softmax (-> p, and each row's max and 1 / sum) and zoo.attention_softmax_backward;
// zoo/kernels/attention.py makes them one autograd.Function, with their shapes
// for torch.compile.
// Written as torch ops, the written-out attention's softmax is six passes over the (B, H, Tq, Tk) scores each way
// (scale, mask, softmax, the casts to and from float32); at short and middle contexts they cost more than the
// two matrix products around them.
//
//   p = softmax(s * scale) over each row of keys, causal: key j of query i only when j <= i + Tk - Tq
//   ds = p * (dp - sum(dp * p)) * scale                      (zero where masked)
//
// Computed in float32 and rounded once to bf16 (to nearest even, as torch rounds). The backward recomputes p from
// the saved scores and each row's max and 1 / sum (the same operations, so the same bits as the forward's),
// instead of keeping p in float32. exp is a polynomial (Cephes' expf: 1-2 ulp in float32, far below bf16's
// rounding) written so the compiler vectorises it; every sum is in fixed lanes, as in rmsnorm.cpp: the same bits
// on any CPU or thread count.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t L = 16;  // lanes of a row's sums

inline float exp_poly(float x) {  // x <= 0 here (a score minus its row's max)
    x = std::max(x, -87.0f);      // below: exp underflows; the row's sum is at least 1, so these are 0 in effect
    // n = x / ln 2 rounded to the nearest integer: adding and taking away 1.5 * 2^23 rounds (no std::floor: the
    // compiler does not vectorise it without fast-math)
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float r = x - n * 0.693359375f - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
}

// bf16 <-> float32 by bit operations, which the compiler vectorises (c10::BFloat16's conversions it does not)
using bf16 = uint16_t;
inline float widen(bf16 x) { return std::bit_cast<float>(static_cast<uint32_t>(x) << 16); }
inline bf16 narrow(float f) {
    const uint32_t u = std::bit_cast<uint32_t>(f);
    return f != f ? bf16(0x7FC0) : static_cast<bf16>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

struct Dims {
    int64_t rows, Tq, Tk;
    bool causal;
    int64_t keys(int64_t row) const {  // how many keys this row's query sees
        return causal ? std::min(Tk, row % Tq + Tk - Tq + 1) : Tk;
    }
};

Dims dims(const at::Tensor& s, bool causal) {
    TORCH_CHECK(s.dim() >= 2 && s.device().is_cpu() && s.is_contiguous() && s.scalar_type() == at::kBFloat16,
                "zoo::attention_softmax: contiguous bf16 (..., Tq, Tk) CPU scores, got ", s.scalar_type(), " ",
                s.sizes());
    const int64_t Tq = s.size(-2), Tk = s.size(-1);
    TORCH_CHECK(!causal || Tk >= Tq, "zoo::attention_softmax: causal needs Tk >= Tq, got ", Tq, " and ", Tk);
    return {Tk ? s.numel() / Tk : 0, Tq, Tk, causal};  // rows: one per query
}

// p of one row into e[0, n) from the scores: e = exp(s * scale - max) * inv
void probabilities(const bf16* __restrict__ s, float* __restrict__ e, int64_t n, float scale, float max, float inv) {
    for (int64_t j = 0; j < n; j++) e[j] = exp_poly(widen(s[j]) * scale - max) * inv;
}

// Sums and maxima of a row in L independent lanes, combined at the end: vectorised without reordering an addition
template <typename F>
float lanes(int64_t n, float init, F&& term, bool take_max) {
    float acc[L];
    for (int64_t k = 0; k < L; k++) acc[k] = init;
    int64_t j = 0;
    for (; j + L <= n; j += L)
        for (int64_t k = 0; k < L; k++) acc[k] = take_max ? std::max(acc[k], term(j + k)) : acc[k] + term(j + k);
    float total = init;
    for (int64_t k = 0; k < L; k++) total = take_max ? std::max(total, acc[k]) : total + acc[k];
    for (; j < n; j++) total = take_max ? std::max(total, term(j)) : total + term(j);
    return total;
}

// fn(r, n, e) for every row r of scores, rows shared by torch's threads: n keys seen, e a scratch row of floats
template <typename F>
void each_row(const Dims& d, F&& fn) {
    at::parallel_for(0, d.rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(d.Tk, 1)), [&](int64_t r0, int64_t r1) {
        std::vector<float> e(d.Tk);
        for (int64_t r = r0; r < r1; r++) fn(r, d.keys(r), e.data());
    });
}

std::vector<int64_t> stats_size(const at::Tensor& s) {  // (..., Tq, 2): each row's max and 1 / sum
    std::vector<int64_t> size = s.sizes().vec();
    size.back() = 2;
    return size;
}

// -> p (bf16) and each row's max and 1 / sum (float32)
std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& s, double scale_, bool causal) {
    const Dims d = dims(s, causal);
    const float scale = static_cast<float>(scale_);
    at::Tensor p = at::empty_like(s), stats = at::empty(stats_size(s), s.options().dtype(at::kFloat));
    const bf16* sp = reinterpret_cast<const bf16*>(s.const_data_ptr());
    bf16* pp = reinterpret_cast<bf16*>(p.data_ptr());
    float* st = stats.data_ptr<float>();
    each_row(d, [&](int64_t r, int64_t n, float* __restrict__ ep) {
        const bf16* __restrict__ row = sp + r * d.Tk;
        bf16* __restrict__ out = pp + r * d.Tk;
        const float max = lanes(n, -std::numeric_limits<float>::infinity(),
                                [&](int64_t j) { return widen(row[j]) * scale; }, true);
        probabilities(row, ep, n, scale, max, 1.0f);
        const float inv = 1.0f / lanes(n, 0.0f, [&](int64_t j) { return ep[j]; }, false);
        for (int64_t j = 0; j < n; j++) out[j] = narrow(ep[j] * inv);
        for (int64_t j = n; j < d.Tk; j++) out[j] = 0;
        st[2 * r] = max, st[2 * r + 1] = inv;
    });
    return {p, stats};
}

at::Tensor backward(const at::Tensor& g_, const at::Tensor& s, const at::Tensor& stats, double scale_, bool causal) {
    const Dims d = dims(s, causal);
    TORCH_CHECK(g_.sizes() == s.sizes() && stats.is_contiguous() && stats.scalar_type() == at::kFloat &&
                stats.sizes() == at::IntArrayRef(stats_size(s)), "zoo::attention_softmax_backward: a gradient "
                "shaped as the scores and the forward's float32 stats, got ", g_.sizes(), " and ", stats.sizes());
    const float scale = static_cast<float>(scale_);
    at::Tensor g = g_.to(at::kBFloat16).contiguous(), ds = at::empty_like(s);
    const bf16* sp = reinterpret_cast<const bf16*>(s.const_data_ptr());
    const bf16* gp = reinterpret_cast<const bf16*>(g.const_data_ptr());
    bf16* dp = reinterpret_cast<bf16*>(ds.data_ptr());
    const float* st = stats.const_data_ptr<float>();
    each_row(d, [&](int64_t r, int64_t n, float* __restrict__ ep) {
        const bf16* __restrict__ gr = gp + r * d.Tk;
        bf16* __restrict__ out = dp + r * d.Tk;
        probabilities(sp + r * d.Tk, ep, n, scale, st[2 * r], st[2 * r + 1]);
        const float dot = lanes(n, 0.0f, [&](int64_t j) { return ep[j] * widen(gr[j]); }, false);
        for (int64_t j = 0; j < n; j++) out[j] = narrow(ep[j] * (widen(gr[j]) - dot) * scale);
        for (int64_t j = n; j < d.Tk; j++) out[j] = 0;
    });
    return ds;
}

}  // namespace

// Autograd (an autograd.Function) and the shapes torch.compile traces with are in Python (zoo/kernels/attention.py):
// the same two ops serve eager mode and compiled graphs.
TORCH_LIBRARY_FRAGMENT(zoo, m) {
    m.def("attention_softmax(Tensor scores, float scale, bool causal) -> (Tensor, Tensor)");
    m.def("attention_softmax_backward(Tensor grad, Tensor scores, Tensor stats, float scale, bool causal) -> Tensor");
}
TORCH_LIBRARY_IMPL(zoo, CPU, m) {
    m.impl("attention_softmax", &forward);
    m.impl("attention_softmax_backward", &backward);
}
