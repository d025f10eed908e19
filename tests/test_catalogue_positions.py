"""Position schemes of the catalogue (issue 41) against references nobody here wrote: x-transformers' modules
(installed) and the papers' formulas written out in float64."""

import math

import pytest
import torch

from tests.helpers import make
from zoo.registry import POSITION

xt = pytest.importorskip("x_transformers.x_transformers")


# ---- ALiBi (Press et al. 2022) at head counts that are not a power of two


def paper_alibi_slopes(n: int) -> list[float]:
    """The paper's rule, written out: for a power of two n the geometric sequence starting at 2^(-8/n) with that
    ratio; otherwise those of the closest lower power of two p, then every other slope of 2p's sequence (its
    1st, 3rd, ...) until there are n."""
    def geometric(m: int) -> list[float]:
        start = 2.0 ** (-8.0 / m)  # the first slope is also the ratio
        return [start ** (i + 1) for i in range(m)]

    p = 2 ** int(math.log2(n))
    return geometric(p) + [s for i, s in enumerate(geometric(2 * p)) if i % 2 == 0][: n - p]


def test_paper_alibi_slopes_as_printed():
    """The rule above gives the paper's own examples: 8 heads 1/2 .. 1/256; 6 heads those of 4 then 2 of 8's."""
    assert paper_alibi_slopes(8) == [2.0 ** -i for i in range(1, 9)]
    assert paper_alibi_slopes(6) == [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3]


@pytest.mark.parametrize("n_heads", [2, 3, 6, 8, 12])
def test_alibi_slopes_follow_the_paper_and_x_transformers(n_heads):
    alibi = make(POSITION, "alibi", d_model=4 * n_heads, n_heads=n_heads, max_seq_len=16)
    ours = alibi.slopes.double()
    torch.testing.assert_close(ours, torch.tensor(paper_alibi_slopes(n_heads), dtype=torch.float64), rtol=1e-7, atol=0)
    theirs = xt.AlibiPositionalBias(heads=n_heads, total_heads=n_heads).slopes.flatten().double()
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=0)
    assert len(set(ours.tolist())) == n_heads  # every head its own slope


@pytest.mark.parametrize("n_heads", [2, 3, 6, 8, 12])
@pytest.mark.parametrize(("t_q", "t_k"), [(13, 13), (1, 13), (4, 9)])
def test_alibi_bias_matches_x_transformers(n_heads, t_q, t_k):
    """The whole bias (H, t_q, t_k), queries the last t_q of the keys (a cached decode at offset t_k - t_q)."""
    alibi = make(POSITION, "alibi", d_model=4 * n_heads, n_heads=n_heads, max_seq_len=16)
    ours = alibi.score_bias(t_q, t_k, t_k - t_q)
    theirs = xt.AlibiPositionalBias(heads=n_heads, total_heads=n_heads)(t_q, t_k)
    torch.testing.assert_close(ours, theirs.reshape(n_heads, t_q, t_k), rtol=1e-6, atol=0)
