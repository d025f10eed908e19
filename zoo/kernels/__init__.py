"""Optional fast implementations of zoo's components, a registry of their own, applied to a built model by one pass.

    model = build_model(cfg)                      # the components' own formulas
    applied = apply_kernels(model, "auto")        # or "none", or a list of names; returns those applied

Each kernel (one file per component it speeds up: norm.py, position.py, attention.py) names the class it speeds
up, when it runs, how it is built (C++ in zoo/kernels/*.cpp, zoo.kernels.build) and its implementation; see
zoo/kernels/apply.py and docs/performance.md. `python -m zoo.kernels list` shows them, `build` builds them ahead.
"""

# Each registers the kernels of the components it speeds up
from zoo.kernels import attention, norm, position  # noqa: F401
from zoo.kernels.apply import (
    AUTO,
    KERNELS,
    NONE,
    Kernel,
    applied_kernels,
    apply_kernels,
    check_policy,
    describe,
    kernel_record,
    record_changes,
    remove_kernels,
)

__all__ = ["AUTO", "KERNELS", "NONE", "Kernel", "applied_kernels", "apply_kernels", "check_policy", "describe",
           "kernel_record", "record_changes", "remove_kernels"]
