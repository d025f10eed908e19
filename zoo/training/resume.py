"""Resuming a run: the checkpoint to resume from, checked against this run's settings, and the settings a resume
(or a sweep continued in its own directory) may change. Configs are compared in their plain form, the form
config.yaml and checkpoints store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoo.build import ConfigError, flatten_config, resolve_config
from zoo.commands import command
from zoo.config.checks import check_trainer
from zoo.config.schema import default_of
from zoo.training.checkpoint import check_weights, read_checkpoint

# Keys a resume may change: where output goes and how it is shown, or how it is computed within rounding
# (threads, kernels: a resume says what changed); never what is computed.
RESUME_MAY_CHANGE = ("ckpt_path", "overwrite", "threads", "kernels", "logger", "sample", "optimized_metric",
                     "trainer.enable_progress_bar", "data.verify", "checkpoints")


def checkpoint_path(plain: dict[str, Any], run_dir: Path, data: Any) -> tuple[str | None, int, str | None]:
    """The checkpoint to resume from, its step and the precision it trained in, checked: it loads safely, holds
    this run's architecture and was trained with this run's settings (all but RESUME_MAY_CHANGE; precision
    auto takes the checkpoint's)."""
    ckpt = plain.get("ckpt_path")
    if ckpt is None:
        return None, 0, None
    path = run_dir / "checkpoints" / "last.ckpt" if ckpt == "last" else Path(ckpt)
    if not path.is_file():
        hint = " (ckpt_path=last looks in <run dir>/checkpoints; pass hydra.run.dir=<the run's dir>)" \
            if ckpt == "last" else ""
        raise ConfigError(f"ckpt_path: no checkpoint at '{path}'{hint}")
    saved_ckpt = read_checkpoint(path)
    if "optimizer_states" not in saved_ckpt:
        raise ConfigError(f"ckpt_path: '{path}' holds a finished run's weights alone (checkpoints=last), nothing "
                          "to resume; valid: a run's last.ckpt (best.ckpt keeps its weights alone), or sample and "
                          f"evaluate from this one ({command('sample')}, {command('eval')})")
    saved_cfg = (saved_ckpt.get("hyper_parameters") or {}).get("cfg") or {}
    # what it trained in: recorded by ZooModule since precision auto, else the config's (then always explicit)
    used = saved_ckpt.get("precision") or _result_settings(saved_cfg).get("trainer.precision", "32-true")
    if difference := settings_difference(plain, saved_cfg, used):
        if difference.startswith("model."):
            raise ConfigError(f"ckpt_path: '{path}' holds a different architecture ({difference})")
        raise ConfigError(f"ckpt_path: '{path}' was trained with other settings ({difference}); a resume may "
                          f"change only {', '.join(RESUME_MAY_CHANGE)}")
    saved = saved_cfg.get("model")
    check_weights(saved_ckpt.get("state_dict"), saved, path)  # weights that fit the architecture it names
    if saved_ckpt.get("tokenizer") not in (None, data.tokenizer.state_dict()):
        raise ConfigError(f"ckpt_path: '{path}' was trained with another tokenizer (data: the text or its "
                          "tokenizer changed since the checkpoint)")
    if difference := data_difference(saved_ckpt.get("data_fingerprint"), getattr(data, "fingerprint", None),
                                     "the checkpoint's"):
        raise ConfigError(f"ckpt_path: '{path}' was trained on other data ({difference})")
    if plain["trainer"].get("precision") == "auto":  # the checkpoint's precision runs: judged as a config's would be
        check_trainer({**plain["trainer"], "precision": used})  # a known one; float16 only on a GPU
    step = saved_ckpt.get("global_step", 0)
    return str(path), step if isinstance(step, int) else 0, used


def data_difference(saved: Any, now: dict[str, str] | None, saved_as: str = "the run's") -> str | None:
    """How the data a run recorded (its fingerprint) differs from this run's, in words naming the file; None
    when they agree or either is not recorded (a run from before zoo recorded it, a plugin's data kind)."""
    if not (isinstance(saved, dict) and isinstance(now, dict)) or saved.get("sha256") == now.get("sha256"):
        return None
    return f"{now['source']} now has sha256 {now['sha256'][:16]}..., {saved_as} {str(saved.get('sha256'))[:16]}..."


def settings_difference(plain: dict[str, Any], saved_cfg: dict[str, Any], saved_precision: str | None = None,
                         saved_as: str = "checkpoint") -> str | None:
    """The first setting that changes the result (all but RESUME_MAY_CHANGE, the architecture included) where
    a saved run's config differs from this run's, as 'key: <saved_as> <v>, this run <v>'; None if none does.
    saved_precision: what the saved run trained in, which `trainer.precision: auto` accepts."""
    ours, theirs = _result_settings(plain), _result_settings(saved_cfg)
    for key in sorted(set(ours) | set(theirs)):
        if key == "trainer.precision" and ours.get(key) in ("auto", saved_precision):
            continue  # auto resumes in the checkpoint's precision; an explicit one must be the same
        # a key the schema gained after the run was saved (optim.eps) counts as its default there
        if ours.get(key, _MISSING) != theirs.get(key, default_of(key, _MISSING)):
            key = key if key in ours and key in theirs else _first_difference(key, plain, saved_cfg)
            return f"{key}: {saved_as} {_lookup(saved_cfg, key)!r}, this run {_lookup(plain, key)!r}"
    saved, model_cfg = _with_defaults(saved_cfg.get("model")), plain["model"]
    if saved != model_cfg:
        ours, theirs = flatten_config(model_cfg), flatten_config(saved or {})
        diff = next((k for k in ours if theirs.get(k) != ours[k]), "name")
        return f"model.{diff}: {saved_as} {theirs.get(diff)!r}, this run {ours.get(diff)!r}"
    return None


def _with_defaults(model_cfg: dict[str, Any] | None) -> dict[str, Any] | None:
    """A saved architecture with the options added since it was saved at their defaults (the parametrization,
    say), so an older run's architecture compares equal to the same one written out today."""
    try:
        return resolve_config(model_cfg).as_dict()  # None: refused below
    except Exception:  # not a config this zoo can resolve: compared as it is, and refused below
        return model_cfg


class _Missing:
    def __repr__(self) -> str:
        return "(not set)"


_MISSING = _Missing()


def _lookup(cfg: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return _MISSING
        cfg = cfg[part]
    return cfg


def _first_difference(key: str, a: dict[str, Any], b: dict[str, Any]) -> str:
    """The shortest prefix of `key` where a and b part (budget: None vs budget: {...} -> budget)."""
    parts = key.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        x, y = _lookup(a, prefix), _lookup(b, prefix)
        if not (isinstance(x, dict) and isinstance(y, dict)):
            return prefix
    return key


def _result_settings(cfg: dict[str, Any]) -> dict[str, Any]:
    flat = flatten_config({k: v for k, v in cfg.items() if k != "model"})
    return {k: v for k, v in flat.items() if not any(k == a or k.startswith(a + ".") for a in RESUME_MAY_CHANGE)}
