"""The run's config: its schema (what Hydra composes), its checks, its sizing and the parameter budget.
Torch-free at import: train.py's checks read the schema before torch loads."""
