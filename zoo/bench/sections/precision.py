"""The precision section: a short train.py run at the large shape in float32 and in bf16-mixed, loss and speed."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from zoo.bench.markdown import num, ratio, table
from zoo.bench.processes import run_train_py
from zoo.bench.registry import section
from zoo.bench.session import Session
from zoo.bench.settings import ROOT, SHAPES


@section("precision")
def section_precision(sess: Session, root: Path = ROOT) -> str:
    """A short train.py run at the large shape in float32 and in bf16-mixed: loss and speed."""
    s, shape = sess.settings, SHAPES["large"]
    head = "## bf16-mixed training against float32\n\n"
    if not (root / "train.py").is_file():
        return head + "skipped: train.py not found\n"
    args = [f"model.n_layers={shape.n_layers}", f"model.n_heads={shape.n_heads}", f"model.d_model={shape.d_model}",
            f"data.context={shape.context}", f"data.batch_size={shape.batch}", f"trainer.max_steps={s.precision_steps}",
            f"trainer.val_check_interval={s.precision_steps}", "optim.warmup_steps=20", "logger=none",
            "sample.max_new_tokens=0"]
    rows, loss, tps = [], {}, {}
    for precision in ("32-true", "bf16-mixed"):
        cmd = [sys.executable, str(root / "train.py"), "experiment=nanogpt_cpu", *args,
               f"trainer.precision={precision}", *s.train_args]
        run = run_train_py(cmd, root)
        if isinstance(run, str):
            return head + run
        summary, _, wall, load = run
        loss[precision], tps[precision] = summary["final"]["val_loss"], summary["tokens_per_second"]
        rows.append([precision, f"{loss[precision]:.4f}", num(tps[precision]), num(wall), load])
    rel = (loss["bf16-mixed"] - loss["32-true"]) / loss["32-true"]
    return head + "\n".join([
        f"`python train.py experiment=nanogpt_cpu {shlex.join(args)} trainer.precision=<precision>` at the large shape "
        f"({shape.describe()}), {s.precision_steps} steps each, the two runs one after the other.", "",
        table(["precision", "final val_loss", "tokens/s", "wall s (process)", "load average"], rows), "",
        f"bf16-mixed val_loss relative to float32: **{rel:+.2%}**; throughput "
        f"**{ratio(tps['bf16-mixed'] / tps['32-true'])}**", ""])
