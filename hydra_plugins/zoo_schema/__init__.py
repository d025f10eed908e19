"""zoo's config schema for every Hydra application in this repository: Hydra imports the modules under
hydra_plugins/ when it starts, before it composes a config, and `store` puts zoo.config.schema's nodes (the
typed schema and one node per registered component) in the ConfigStore. train.py, the tests' compose
calls and zoo.inspect all get them this way."""
