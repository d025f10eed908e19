"""The three lineages. Importing a module registers its model."""

from zoo.models import decoder_only, encoder_decoder, encoder_only  # noqa: F401
