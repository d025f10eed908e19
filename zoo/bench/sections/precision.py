"""The precision section: a short training run at the large shape in float32 and in bf16-mixed, loss and speed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from zoo.bench.markdown import num, ratio, table
from zoo.bench.processes import TRAIN, run_training, shown
from zoo.bench.registry import section
from zoo.bench.session import Session
from zoo.bench.settings import SHAPES


@section("precision")
def section_precision(sess: Session, workdir: Path | None = None, train: Sequence[str] = TRAIN) -> str:
    """A short training run (`train`, in `workdir`: default the current directory) at the large shape in float32
    and in bf16-mixed: loss and speed."""
    s, shape = sess.settings, SHAPES["large"]
    head = "## bf16-mixed training against float32\n\n"
    workdir = Path.cwd() if workdir is None else workdir
    args = [f"model.n_layers={shape.n_layers}", f"model.n_heads={shape.n_heads}", f"model.d_model={shape.d_model}",
            f"data.context={shape.context}", f"data.batch_size={shape.batch}", f"trainer.max_steps={s.precision_steps}",
            f"trainer.val_check_interval={s.precision_steps}", "optim.warmup_steps=20", "logger=none",
            "sample.max_new_tokens=0"]
    rows, loss, tps = [], {}, {}
    for precision in ("32-true", "bf16-mixed"):
        cmd = [*train, "experiment=nanogpt_cpu", *args, f"trainer.precision={precision}", *s.train_args]
        run = run_training(cmd, workdir)
        if isinstance(run, str):
            return head + run
        summary, _, wall, load = run
        loss[precision], tps[precision] = summary["final"]["val_loss"], summary["tokens_per_second"]
        rows.append([precision, f"{loss[precision]:.4f}", num(tps[precision]), num(wall), load])
    rel = (loss["bf16-mixed"] - loss["32-true"]) / loss["32-true"]
    return head + "\n".join([
        f"`{shown(['experiment=nanogpt_cpu', *args])} trainer.precision=<precision>` at the large shape "
        f"({shape.describe()}), {s.precision_steps} steps each, the two runs one after the other.", "",
        table(["precision", "final val_loss", "tokens/s", "wall s (process)", "load average"], rows), "",
        f"bf16-mixed val_loss relative to float32: **{rel:+.2%}**; throughput "
        f"**{ratio(tps['bf16-mixed'] / tps['32-true'])}**", ""])
