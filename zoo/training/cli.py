"""Command-line conveniences for train.py, applied before Hydra sees the arguments."""

from __future__ import annotations

from pathlib import Path

COMPONENTS = ("attention.", "position.", "norm.", "ffn.")


def expand(arg: str) -> str:
    """norm.type=rmsnorm -> model.norm.type=rmsnorm (a component's options live under model)."""
    return f"model.{arg}" if arg.startswith(COMPONENTS) and "=" in arg else arg


def check_group_choices(args: list[str], conf_dir: Path) -> str | None:
    """One-line error for `group=option` naming an option that does not exist, else None.

    Hydra would report it too, but over many lines; sweeps (`ffn=relu,gelu`) are checked per value."""
    for arg in args:
        key, sep, value = arg.lstrip("+~").partition("=")
        group = conf_dir / key
        if not sep or "/" in key or not group.is_dir() or value in ("", "null"):
            continue
        valid = sorted(p.stem for p in group.glob("*.yaml"))
        for choice in value.split(","):
            if choice not in valid and not any(c in choice for c in "()[]{}*$"):
                return f"{key}: unknown option '{choice}'; valid: {', '.join(valid)}"
    return None


def check_run_dir_free(args: list[str]) -> str | None:
    """One-line error if `hydra.run.dir=<dir>` names a directory a live run holds, else None.

    Checked before Hydra starts, because Hydra writes .hydra/ and its log into the directory first;
    the run checks again (and takes the lock) itself."""
    from zoo.io import busy_message, is_running, is_secondary_rank

    if is_secondary_rank() or any(a in ("-m", "--multirun") for a in args):
        return None  # a DDP worker runs in its first process's directory
    for arg in args:
        key, sep, value = arg.partition("=")
        if key == "hydra.run.dir" and sep and is_running(value):
            return busy_message(value)
    return None
