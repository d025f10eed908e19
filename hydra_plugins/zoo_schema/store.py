"""Imported by Hydra's plugin scan (see __init__.py); its work is this one call."""

from zoo.config.schema import register

register()
