"""python -m zoo.report --across: each row's verdict against the baseline in several hand-made sweeps (one per
application, as study=narang, narang_bpe and narang_seq2seq write them) and whether it transfers."""

import json
from pathlib import Path

import pytest

from tests.test_report import PNG, fake_run, tables
from zoo.report import main

# Three seeds a row, spread 0.01 around the mean: a gap of 0.1 is far beyond seed noise (Welch p < 0.001), 0.005
# well within it.
SEEDS = (0.0, 0.01, -0.01)
SKIPPED = {"funnel": "decoder-only: pooling would mix each token with the next one it must not see"}


def application(root: Path, rows: dict[str, dict[str, float]], skipped: dict[str, str] | None = None) -> Path:
    """A sweep of narang=<row> x 3 seeds, each run's final metrics the row's means plus the seed's offset (the loss
    down, exact match up: directions as train.py records them); `skipped` as the study's multirun.yaml lists it."""
    job = 0
    for row, means in rows.items():
        for seed, offset in enumerate(SEEDS):
            d = root / str(job)
            fake_run(d, [f"narang={row}", f"seed={seed}"], [5.0, means["val_loss"] + offset])
            summary = json.loads((d / "summary.json").read_text())
            summary["final"] = {metric: mean + offset for metric, mean in means.items()}
            summary["directions"] = {"val_loss": "min", "exact_match": "max"}
            (d / "summary.json").write_text(json.dumps(summary))
            job += 1
    if skipped:
        (root / "multirun.yaml").write_text(json.dumps({"hydra": {"callbacks": {"report": {"skipped": skipped}}}}))
    return root


@pytest.fixture
def studies(tmp_path) -> list[str]:
    """The three applications: vanilla; swiglu better everywhere (exact match higher); gelu better in both
    language models but worse in seq2seq; funnel not run in the char LM; rezero within noise in the BPE LM."""
    char = application(tmp_path / "multirun" / "study-narang" / "budget-None", {
        "vanilla": {"val_loss": 2.0}, "swiglu": {"val_loss": 1.9}, "gelu": {"val_loss": 1.9},
        "rezero": {"val_loss": 1.9}}, SKIPPED)
    bpe = application(tmp_path / "multirun" / "study-narang_bpe" / "budget-None", {
        "vanilla": {"val_loss": 4.0}, "swiglu": {"val_loss": 3.9}, "gelu": {"val_loss": 3.8},
        "funnel": {"val_loss": 3.9}, "rezero": {"val_loss": 4.005}})
    seq = application(tmp_path / "multirun" / "study-narang_seq2seq" / "budget-None", {
        "vanilla": {"val_loss": 1.0, "exact_match": 0.5}, "swiglu": {"val_loss": 0.9, "exact_match": 0.6},
        "gelu": {"val_loss": 1.1, "exact_match": 0.4}, "funnel": {"val_loss": 0.9, "exact_match": 0.6},
        "rezero": {"val_loss": 0.9, "exact_match": 0.6}})
    return [str(char), str(bpe), f"{seq}:val_loss", f"{seq}:exact_match"]


def across_table(path: Path) -> dict[str, dict[str, str]]:
    """across.md's table as {variant: {column: cell}}."""
    head, *body = tables(path.read_text())[0]
    return {r[0]: dict(zip(head, r, strict=True)) for r in body}


def test_a_row_transfers_only_where_it_is_better_in_every_application(studies, tmp_path, capsys):
    out = tmp_path / "across.md"
    assert main(["--across", *studies, "--baseline", "narang=vanilla", "--out", str(out)]) == 0
    table = across_table(out)
    assert list(table["swiglu"]) == ["variant", "narang val_loss", "narang_bpe val_loss", "narang_seq2seq val_loss",
                                     "narang_seq2seq exact_match", "across applications"]
    assert table["swiglu"]["narang val_loss"] == "better -0.1"  # 1.9 - 2.0, beyond the seeds' 0.01
    assert table["swiglu"]["narang_seq2seq exact_match"] == "better +0.1"  # higher exact match is better
    assert table["swiglu"]["across applications"] == "transfers"
    assert table["gelu"]["narang_bpe val_loss"] == "better -0.2"
    assert table["gelu"]["narang_seq2seq val_loss"] == "worse +0.1"
    assert table["gelu"]["narang_seq2seq exact_match"] == "worse -0.1"
    assert table["gelu"]["across applications"] == "does not transfer"
    assert table["rezero"]["narang_bpe val_loss"].startswith("within noise +0.00")
    assert table["rezero"]["across applications"] == "does not transfer"
    assert table["funnel"]["narang val_loss"] == f"not run: {SKIPPED['funnel']}"
    assert table["funnel"]["across applications"] == "incomplete"  # better in the other three
    assert "vanilla" not in table  # the baseline is no row
    assert capsys.readouterr().out.startswith("# Across applications: each row against narang=vanilla")
    figure = (tmp_path / "across.png").read_bytes()  # the same effects drawn, one panel per application
    assert figure.startswith(PNG) and len(figure) > 10000
    assert out.read_text().rstrip().endswith("(across.png)")


def test_a_row_without_a_verdict_somewhere_is_incomplete(tmp_path):
    """One seed has no noise to test against ('-'); a row absent from a sweep that does not list it is missing."""
    a = application(tmp_path / "a", {"vanilla": {"val_loss": 2.0}, "swiglu": {"val_loss": 1.9},
                                     "gelu": {"val_loss": 1.9}})
    b = application(tmp_path / "b", {"vanilla": {"val_loss": 2.0}, "swiglu": {"val_loss": 1.9}})
    fake_run(b / "9", ["narang=gelu", "seed=0"], [5.0, 1.5])
    c = application(tmp_path / "c", {"vanilla": {"val_loss": 2.0}, "gelu": {"val_loss": 1.9}})
    out = tmp_path / "x" / "across.md"
    assert main(["--across", str(a), str(b), str(c), "--baseline", "narang=vanilla", "--out", str(out)]) == 0
    table = across_table(out)
    assert (table["gelu"]["b val_loss"], table["gelu"]["across applications"]) == ("-", "incomplete")
    assert (table["swiglu"]["c val_loss"], table["swiglu"]["across applications"]) == ("missing: no run", "incomplete")


def test_the_default_file_is_across_md_here(studies, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--across", *studies[:2], "--baseline", "narang=vanilla"]) == 0
    assert across_table(tmp_path / "across.md")["swiglu"]["across applications"] == "transfers"
    (tmp_path / "reports").mkdir()  # --out a directory: across.md in it
    assert main(["--across", *studies[:2], "--baseline", "narang=vanilla", "--out", str(tmp_path / "reports")]) == 0
    assert (tmp_path / "reports" / "across.md").read_text() == (tmp_path / "across.md").read_text()
    assert (tmp_path / "reports" / "across.png").read_bytes().startswith(PNG)
    assert main(["--across", *studies[:2], "--baseline", "narang=vanilla", "--out", "narang.md"]) == 0
    assert (tmp_path / "narang.md").read_text().rstrip().endswith("(narang.png)")  # the figure named as the file
    assert (tmp_path / "narang.png").read_bytes().startswith(PNG)


@pytest.mark.parametrize("spec,message", [
    (lambda s, t: [s[0], str(t / "missing")], "error: no such directory: "),
    (lambda s, t: [s[0], s[1] + ":val_bleu"], "error: --metric: no run has 'val_bleu'; available: val_loss"),
    (lambda s, t: [s[0], s[0]], "' is given twice"),
])
def test_a_bad_application_is_one_line_and_writes_nothing(studies, tmp_path, capsys, spec, message):
    out = tmp_path / "across.md"
    assert main(["--across", *spec(studies, tmp_path), "--baseline", "narang=vanilla", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("error: ") and err.count("\n") == 1, err
    assert not out.exists() and not out.with_suffix(".png").exists()


def test_a_baseline_absent_from_one_application_is_one_line_and_writes_nothing(studies, tmp_path, capsys):
    other = application(tmp_path / "other", {"relu": {"val_loss": 2.0}, "swiglu": {"val_loss": 1.9}})
    out = tmp_path / "across.md"
    assert main(["--across", studies[0], str(other), "--baseline", "narang=vanilla", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == "error: --baseline: no variant match 'narang=vanilla'; variants: relu; swiglu\n"
    assert not out.exists()


@pytest.mark.parametrize("args,message", [
    (["DIR"], "DIR 'DIR' and --across together"),
    (["--target", "1.9"], "--target and --across together"),
    (["--metric", "exact_match"], "--metric and --across together"),
    ([], None),  # fine: the usage is checked before any directory is read
])
def test_across_refuses_a_mix_in_one_line(studies, tmp_path, capsys, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    argv = [*args, "--across", *studies[:2], "--baseline", "narang=vanilla"]
    if message is None:
        assert main(argv) == 0
        return
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "across.md").exists()


@pytest.mark.parametrize("argv,message", [
    (["--across", "a", "--baseline", "narang=vanilla"], "--across: give two or more applications"),
    (["--across", "a", "b"], "--across needs --baseline"),
    ([], "the following arguments are required: dir (or several: --across DIR[:METRIC] ...)"),
])
def test_across_usage_errors(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err
