"""Checks of a run's values (optimizer, seed, trainer, data sizes, sampling, memory) before any data is loaded
or weight allocated: each bad value is one ConfigError naming its key, the value and what is valid.

The architecture's own values are checked in zoo.build.resolve_config; data files in zoo.training.data.
"""

from __future__ import annotations

from typing import Any, NoReturn

import torch

from zoo.build import ModelInput, count_params, meta_model
from zoo.component import ConfigError, is_int, is_number
from zoo.data.tokenizers import BPETokenizer
from zoo.hardware import AUTO, resolve_precision
from zoo.hardware import on_gpu as _on_gpu
from zoo.io import first_line
from zoo.kernels import check_policy  # imports the kernels and the components they serve
from zoo.optim import check, resolve, state_numbers
from zoo.registry import OPTIM
from zoo.spec import sampling_error

# auto: bf16-mixed where the hardware computes bf16 natively, else 32-true (zoo.hardware.resolve_precision)
PRECISIONS = (AUTO, None, "32-true", "32", 32, "bf16-mixed", "bf16", "16-mixed", "16", 16, "bf16-true", "16-true",
              "64-true", "64", 64)
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps")
BYTES_PER_PARAM = {"64-true": 8, "64": 8, 64: 8, "bf16-true": 2, "16-true": 2}  # else float32 weights (4)
TRAINING_COPIES = 2  # weights and gradients; the optimizer's state comes on top (zoo.optim.state_numbers)


def _fail(key: str, v: Any, valid: str) -> NoReturn:
    raise ConfigError(f"{key}: got {v!r}; valid: {valid}")


def _int_at_least(key: str, v: Any, low: int) -> None:
    if not is_int(v) or v < low:
        _fail(key, v, f"an integer >= {low}")


def _optional_int_at_least(key: str, v: Any, low: int) -> None:
    if v is not None:
        if not is_int(v) or v < low:
            _fail(key, v, f"an integer >= {low}, or null")


def check_seed(v: Any) -> None:
    if not is_int(v) or not 0 <= v < 2**32:  # numpy's and Lightning's seeds are unsigned 32-bit
        _fail("seed", v, "an integer in [0, 2^32)")


def check_optim(plain: dict[str, Any]) -> None:
    """The optimizer (optim=<name>, zoo/optim/): its options, and the run settings it cannot train with."""
    check(plain.get("optim") or {}, plain)


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# Trainer arguments the run sets itself (zoo.training.runner.run): a config cannot set them too.
RUN_SETS = ("logger", "callbacks", "plugins", "num_sanity_val_steps", "enable_model_summary", "default_root_dir",
            "check_val_every_n_epoch", "use_distributed_sampler")


def check_trainer(trainer: dict[str, Any]) -> None:
    import inspect

    # lazy: Lightning (7 s after torch): sample and eval load checkpoints through this module
    import lightning as L

    params = sorted(set(inspect.signature(L.Trainer.__init__).parameters) - {"self"} - set(RUN_SETS))
    for key in trainer:
        if key not in params:  # `+trainer.max_step=...` gets past Hydra's key check
            import difflib

            close = difflib.get_close_matches(key, params, n=1)
            what = "is set by the run itself" if key in RUN_SETS else "is not a Trainer argument"
            hint = f" (did you mean trainer.{close[0]}?)" if close and key not in RUN_SETS else ""
            raise ConfigError(f"trainer.{key}: {what}{hint}; valid: {', '.join(params)}")
    strategy = trainer.get("strategy", "auto")
    if isinstance(strategy, str):
        # lazy: Lightning (7 s after torch), as above
        from lightning.pytorch.strategies import StrategyRegistry

        valid = ["auto", "ddp", "ddp_spawn", "fsdp", "deepspeed", *StrategyRegistry.available_strategies()]
        if strategy not in valid:
            _fail("trainer.strategy", strategy, ", ".join(dict.fromkeys(valid)))
    else:
        _fail("trainer.strategy", strategy, "a strategy name, e.g. auto, ddp, fsdp")
    if trainer.get("deterministic", False) not in (True, False, "warn"):
        _fail("trainer.deterministic", trainer.get("deterministic"), "true, false or warn")
    precision = trainer.get("precision", "32-true")
    if precision not in PRECISIONS:
        _fail("trainer.precision", precision, ", ".join(dict.fromkeys(str(p) for p in PRECISIONS if p)) + ", null")
    acc = trainer.get("accelerator", "auto")
    if acc not in ACCELERATORS:
        _fail("trainer.accelerator", acc, ", ".join(ACCELERATORS))
    gpus = _cuda_count()
    if acc in ("gpu", "cuda") and gpus == 0:
        raise ConfigError(f"trainer.accelerator: '{acc}' but this machine has no CUDA GPU; valid here: cpu, auto "
                          "(trainer=cpu)")
    if acc == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError("trainer.accelerator: 'mps' but this machine has no Apple GPU; valid here: cpu, auto")
    on_gpu = _on_gpu(trainer)
    if not on_gpu and precision in ("16-mixed", "16", 16, "16-true"):
        raise ConfigError(f"trainer.precision: {precision!r} (float16) needs a GPU; valid on CPU: auto, 32-true, "
                          "bf16-mixed, bf16-true, 64-true")
    _check_devices(trainer.get("devices", "auto"), gpus if on_gpu else None, on_gpu)
    interval = trainer.get("val_check_interval")
    # steps (training is counted in steps: check_val_every_n_epoch=None), or Lightning's time-based 'DD:HH:MM:SS'
    if interval is not None and not ((is_int(interval) and interval > 0) or isinstance(interval, (str, dict))):
        _fail("trainer.val_check_interval", interval, "an integer number of steps > 0")
    _int_at_least("trainer.accumulate_grad_batches", trainer.get("accumulate_grad_batches", 1), 1)
    _int_at_least("trainer.log_every_n_steps", trainer.get("log_every_n_steps", 50), 1)
    clip = trainer.get("gradient_clip_val")
    if clip is not None and (not is_number(clip) or clip < 0):
        _fail("trainer.gradient_clip_val", clip, "a finite number >= 0, or null")


def check_trainer_accepts(trainer: dict[str, Any]) -> None:
    """Let Lightning judge the remaining Trainer arguments (max_epochs, limit_val_batches, ...): build a
    Trainer from them, which allocates nothing and launches no process, so its error is one line now
    instead of a traceback after the model is built."""
    # lazy: Lightning (7 s after torch), as above
    import lightning as L
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        quiet = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                 "enable_model_summary": False, "num_sanity_val_steps": 0, "check_val_every_n_epoch": None,
                 "use_distributed_sampler": False}
        # the user's keys (auto's precision resolved, as the run will), with what this probe must not do
        L.Trainer(**{**trainer, "precision": resolve_precision(trainer), **quiet})
    except (MisconfigurationException, ValueError, TypeError) as e:
        first = first_line(e)
        raise ConfigError(f"trainer: {first}") from None


def _check_devices(devices: Any, available: int | None, on_gpu: bool) -> None:
    """available: the GPUs there are; None on CPU, where a count is that many processes (trainer=ddp)."""
    if on_gpu:
        valid = f"auto, -1 (all), a count 1..{available}, or a list of GPU indices ({available} here)"
    else:
        valid = "auto, -1, or a count of processes >= 1 (on CPU)"
    available = available if available is not None else 1 << 30
    if devices in ("auto", -1, "-1"):
        return
    value = devices
    if isinstance(devices, str):  # Lightning also takes "2" and "0,1"
        parts = [p.strip() for p in devices.split(",") if p.strip()]
        if not parts or not all(p.isdigit() for p in parts):
            _fail("trainer.devices", devices, valid)
        value = int(parts[0]) if len(parts) == 1 and "," not in devices else [int(p) for p in parts]
    if is_int(value):
        if not 1 <= value <= available:
            _fail("trainer.devices", devices, valid)
    elif isinstance(value, (list, tuple)):
        if not value or not all(is_int(i) and 0 <= i < available for i in value):
            _fail("trainer.devices", devices, valid)
        if not on_gpu:  # Lightning's CPU accelerator takes a count only
            _fail("trainer.devices", devices, valid)
    else:
        _fail("trainer.devices", devices, valid)


def check_data(data: dict[str, Any]) -> None:
    kind = data.get("kind")
    if data.get("path") is not None and not isinstance(data["path"], str):
        _fail("data.path", data["path"], "a file path, or null for the embedded corpus")
    fraction = data.get("val_fraction", 0.1)
    if not is_number(fraction):  # the range is checked where the text is split
        _fail("data.val_fraction", fraction, "a number between 0 and 1 (exclusive)")
    if kind == "task":
        _int_at_least("data.n_train", data.get("n_train"), 1)
        for key in ("n_val", "n_test", "eval_examples"):
            if key in data:
                _int_at_least(f"data.{key}", data[key], 1)  # 0 leaves the exact-match metrics empty
        for key in ("train_len", "test_len"):
            v = data.get(key)
            if not isinstance(v, (list, tuple)) or len(v) != 2 or not all(is_int(x) and x > 0 for x in v) \
                    or v[0] > v[1]:
                _fail(f"data.{key}", v, "[min, max]: two positive integers, min <= max")
        return
    if "eval_batches" in data:
        _int_at_least("data.eval_batches", data["eval_batches"], 1)  # 0: no validation, an empty `final`
    if data.get("tokenizer") == "bpe":
        _int_at_least("data.vocab_size", data.get("vocab_size"), BPETokenizer.MIN_VOCAB)  # specials + 256 bytes


def check_sample(sample: dict[str, Any]) -> None:
    """The config's sample.* keys: what the run prints after training."""
    if not isinstance(sample.get("prompt", ""), str):
        _fail("sample.prompt", sample.get("prompt"), "text")
    keys = ("max_new_tokens", "temperature", "top_k", "top_p")
    if error := sampling_error(sample.get("max_new_tokens", 0), sample.get("temperature", 1.0), sample.get("top_k"),
                               sample.get("top_p"), names={k: f"sample.{k}" for k in keys}):
        raise ConfigError(error)


def available_memory(trainer: dict[str, Any] | None = None) -> tuple[int, str]:
    """(bytes free, where): the smallest free memory of the GPUs a run would use, else MemAvailable."""
    if trainer is not None and _on_gpu(trainer) and _cuda_count() > 0:
        if any(w in str(trainer.get("strategy", "")) for w in ("fork", "notebook")):
            return 1 << 62, "unknown"  # asking would initialise CUDA, which a forking strategy forbids

        return min(torch.cuda.mem_get_info(i)[0] for i in range(_cuda_count())), "free on the GPU"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available RAM"
    except OSError:
        pass
    try:
        import psutil

        return psutil.virtual_memory().available, "available RAM"
    except ImportError:
        return 1 << 62, "unknown"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_memory(model_cfg: ModelInput, trainer: dict[str, Any] | None = None, training: bool = True,
                 key: str = "model", optim: dict[str, Any] | None = None) -> None:
    """Refuse a model whose weights (and, to train, gradients and the state of `optim`, the run's optim section:
    AdamW's two moments, Muon's one momentum buffer for the matrices it takes) cannot fit in memory, from the
    parameters alone, before anything is allocated. Activations come on top."""
    params = count_params(model_cfg)["total"]
    numbers = params
    if training:
        optimizer = resolve(optim)
        numbers = TRAINING_COPIES * params + state_numbers(meta_model(model_cfg), optimizer)
    precision = (trainer or {}).get("precision", "32-true")
    need = numbers * BYTES_PER_PARAM.get(precision, 4)
    have, where = available_memory(trainer)
    if need > have:
        what = f"weights, gradients and {OPTIM.get(optimizer.name).__name__} state" if training else "weights"
        raise ConfigError(f"{key}: {params:,} parameters need {_gib(need)} for {what}, but there is "
                          f"{_gib(have)} {where}; valid: a smaller model (model.d_model, model.n_layers, "
                          "data.vocab_size)")


# what a finished run keeps (zoo.config.schema.ZooConfig.checkpoints)
KEEP_CHECKPOINTS = ("best_weights", "all", "last", "none")


def check_token_rule(tokens_per_param: Any, evals_per_run: Any) -> None:
    if tokens_per_param is not None and (not is_number(tokens_per_param) or tokens_per_param <= 0):
        _fail("tokens_per_param", tokens_per_param, "a positive number of training tokens per parameter, or null")
    _optional_int_at_least("evals_per_run", evals_per_run, 1)


def check_kernels(policy: Any) -> None:
    """kernels: auto, none or a list of registered kernel names (zoo.kernels), before any data is read."""
    check_policy(policy)


def check_run(plain: dict[str, Any]) -> None:
    """Every value of a run config that the architecture check does not cover, in config order."""
    for section in ("model", "data", "trainer", "optim", "sample"):
        if not isinstance(plain.get(section), dict):
            _fail(section, plain.get(section), f"a mapping of {section} settings (see zoo/config/schema.py)")
    check_seed(plain.get("seed"))
    for key in ("compile", "tf32"):
        if not isinstance(plain.get(key, False), bool):
            _fail(key, plain.get(key), "true or false")
    check_token_rule(plain.get("tokens_per_param"), plain.get("evals_per_run"))
    check_kernels(plain.get("kernels", "auto"))
    if plain.get("checkpoints", "best_weights") not in KEEP_CHECKPOINTS:
        _fail("checkpoints", plain.get("checkpoints"), ", ".join(KEEP_CHECKPOINTS))
    ckpt = plain.get("ckpt_path")
    if ckpt is not None and not isinstance(ckpt, str):
        _fail("ckpt_path", ckpt, "a .ckpt path, last, or null")
    check_optim(plain)
    check_trainer(plain.get("trainer") or {})
    check_data(plain.get("data") or {})
    check_sample(plain.get("sample") or {})
    check_trainer_accepts(plain["trainer"])
