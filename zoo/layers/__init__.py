"""Architecture components. Importing a module registers its components."""

from zoo.layers import attention, ffn, norm, position, residual  # noqa: F401
