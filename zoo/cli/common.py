"""A config composed as train.py composes it, for the tools that read one (zoo eval, zoo inspect). What every tool
shares (exit codes, a parser whose mistakes are one line, where the configs are) is zoo.commands.
Nothing here imports torch: `zoo --help` and a tool's usage errors answer at once."""

from __future__ import annotations

from zoo.commands import config_dir
from zoo.component import ConfigError  # no torch
from zoo.io import first_line

# ----------------------------------------------------------------------------------------------
# A config, composed as train.py would
# ----------------------------------------------------------------------------------------------

def compose(overrides: list[str]) -> dict:
    """The config train.py would see for these overrides, as a plain dict (no hydra node); ConfigError in one
    line for an override that does not compose."""
    # lazy: `zoo eval --help` and `zoo inspect --help` answer without Hydra (its compose API and omegaconf 0.16 s)
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from zoo.config.schema import one_line
    from zoo.training.cli import check_group_choices, expand

    conf = config_dir()
    overrides = [expand(o) for o in overrides]
    if any("," in o.partition("=")[2] and (conf / o.partition("=")[0]).is_dir() for o in overrides):
        raise ConfigError("overrides: a sweep (a,b) is several configs; give one choice")
    if error := check_group_choices(overrides, conf):
        raise ConfigError(error)
    try:
        with initialize_config_dir(config_dir=str(conf), version_base="1.3", job_name="zoo"):
            cfg = hydra_compose("config", overrides=overrides)
        plain = OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # hydra and omegaconf errors span many lines and types: keep the first line
        if typed := one_line(e):  # a wrongly typed value: its key, the value and the type
            raise ConfigError(typed) from None
        raise ConfigError(f"overrides: {first_line(e)}") from None
    assert isinstance(plain, dict)  # config.yaml is a mapping
    return plain
