"""What a newcomer sees: the start banner, checkpoints after a short run, sampling as documented, debug=fast."""

import json
import sys
from pathlib import Path

from tests import zygote

ROOT = Path(__file__).resolve().parents[2]


def test_a_run_shorter_than_val_check_interval_keeps_a_best_checkpoint(train, capsys):
    code, run_dir = train(["trainer.max_steps=20", "trainer.val_check_interval=250", "logger=none",
                           "sample.max_new_tokens=0"])
    assert code == 0
    assert (run_dir / "checkpoints" / "best.ckpt").is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file()
    s = json.loads((run_dir / "summary.json").read_text())
    assert [h["step"] for h in s["history"]] == [20]  # one evaluation, at the last step
    out = capsys.readouterr().out
    banner = out[:out.index("\n", out.index("\n") + 1)]  # the first two lines
    for part in ("decoder_only (mha/learned/pre-layernorm/gelu)", "M parameters", "MFLOPs per token",
                 "precision 32-true", "cpu", f"run directory: {run_dir}"):
        assert part in banner, part


def test_sampling_as_documented_on_a_learned_position_model(train, capsys):
    from zoo.sample import main as sample_main

    # context 16 sets max_seq_len 16: the end-of-training sample and the documented command go past it
    code, run_dir = train(["logger=none", "sample.max_new_tokens=40"])
    assert code == 0
    out = capsys.readouterr().out
    header, _, rest = out.partition("--- sample")
    body = rest.split("\n", 1)[1].rsplit("\n--------------", 1)[0]
    assert "sliding window of the last 16" in rest.split("\n", 1)[0] and len(body) > 16  # not cut at 16
    assert sample_main([str(run_dir / "checkpoints" / "best.ckpt"), "--prompt", "ROMEO:"]) == 0
    captured = capsys.readouterr()
    text = captured.out.split("-" * 40)[0]
    assert text.startswith("ROMEO:") and len(text) > 64  # 200 tokens, some of them special (not shown)
    assert captured.err.count("note:") == 1 and "sliding window" in captured.err


def test_the_unknown_characters_hint_only_on_that_error(train, capsys):
    from zoo.sample import main as sample_main

    code, run_dir = train(["model=encoder_only", "logger=none"])
    capsys.readouterr()
    assert sample_main([str(run_dir / "checkpoints" / "best.ckpt")]) == 2
    err = capsys.readouterr().err
    assert "does not generate" in err and "--unknown" not in err


def test_debug_fast_is_a_quiet_short_run_without_checkpoints(tmp_path):
    cmd = [sys.executable, "train.py", "debug=fast", "model.d_model=32", "model.n_layers=1", "model.n_heads=2",
           "data.context=16", "threads=1", f"hydra.run.dir={tmp_path}"]
    proc = zygote.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["status"] == "completed" and s["steps"] == 10 and len(s["history"]) == 1
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "train.log").exists()
    assert "--- sample" not in proc.stdout and "10/10" in proc.stdout
    assert "Epoch" not in proc.stdout and "INFO" not in proc.stdout + proc.stderr  # steps; no framework lines
    assert proc.stderr.strip() == "", proc.stderr[-2000:]
    final = [seg for seg in proc.stdout.replace("\r", "\n").splitlines() if "10/10" in seg][-1]
    assert "tok/s=" in final and "it/s" not in final and "s/it" not in final  # one notion of speed: tok/s


def test_info_lines_come_from_the_first_process_only_and_errors_from_every_one(monkeypatch, capsys):
    """One rank-zero logger (zoo.training.console): under DDP a line is said once, an error by each process."""
    from zoo.training.console import say, warn

    say("first")
    monkeypatch.setenv("LOCAL_RANK", "1")  # a DDP worker other than the first
    say("second")
    warn("error: third")
    out, err = capsys.readouterr()
    assert out == "first\n" and err == "error: third\n"
