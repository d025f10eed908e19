"""Architecture components. Importing a module registers its components."""

from zoo.layers import attention, ffn, moe, norm, position, residual  # noqa: F401
