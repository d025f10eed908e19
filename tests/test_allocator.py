"""zoo.allocator: freed activations stay in the process for the next step to reuse."""

import os

import pytest
import torch

from zoo.allocator import keep_freed_memory


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_freed_memory_stays_resident():
    if not keep_freed_memory():
        pytest.skip("not Linux with glibc")
    n = 24 << 20  # 24 MiB: above glibc's default mmap threshold, below the raised one
    t = torch.ones(n // 4)
    held = _rss_bytes()
    del t
    torch.ones(16)  # any allocation after the free
    assert _rss_bytes() > held - n // 2  # not handed back: the next step reuses it without page faults
