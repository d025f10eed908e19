"""zoo.bench: the quick path of its sections at tiny sizes. No timing assertions: the machine is noisy."""

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests import zygote
from zoo import bench
from zoo.bench import Settings, cli, processes, sections, writer
from zoo.bench.machine import machine_info
from zoo.bench.registry import SECTIONS, SectionRegistry
from zoo.build import ConfigError
from zoo.kernels import KERNELS

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: on a shared 2-core machine, two threads slow down many-fold when another process
    runs, one barely does. Restored afterwards for the other tests."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def quick(**over) -> Settings:
    base = dict(shapes=("tiny",), peers=("zoo",), gen_shape="tiny", gen_contexts=(8, 16), gen_new_tokens=2,
                gen_rounds=1, kv_context=24, matmul_n=128, matmul_repeats=2, min_rounds=2, max_rounds=2)
    return Settings.quick_run(**{**base, **over})


def rows_of(markdown: str, header: str) -> list[dict[str, str]]:
    """The rows of the Markdown table whose header line starts with `header`, as dicts by column."""
    lines = markdown.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(header))
    cols = [c.strip() for c in lines[start].strip("|").split("|")]
    out = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        out.append(dict(zip(cols, (c.strip() for c in ln.strip("|").split("|")), strict=True)))
    return out


def positive(cell: str) -> float:
    value = float(cell.rstrip("x%").replace("*", ""))
    assert math.isfinite(value) and value > 0, cell
    return value


def test_train_section_table():
    md = sections.train.section_train(bench.Session(quick()))
    rows = rows_of(md, "| family | contender | params | median ms | IQR ms | min ms | tokens/s | time / zoo |")
    zoo_rows = [r for r in rows if r["contender"] == "zoo"]
    assert [r["family"] for r in zoo_rows] == ["GPT-2 style", "Llama style"]
    for r in zoo_rows:
        for col in ("params", "median ms", "min ms", "tokens/s", "time / zoo"):
            positive(r[col])
        assert r["time / zoo"] == "1.00x"
    # peers left out by --peers are listed with the reason, not silently dropped
    assert any(r["contender"] == "HF transformers" and "not selected" in r["notes"] for r in rows)


def test_generation_section_table():
    md = sections.generate.section_generate(bench.Session(quick()))
    rows = rows_of(md, "| context | with cache ms/token | IQR | without cache ms/token |")
    assert [r["context"] for r in rows] == ["8", "16"]
    for r in rows:
        for col in ("with cache ms/token", "without cache ms/token", "cache speedup", "best speedup", "prefill ms"):
            positive(r[col])
    assert "KV-cache speedup at context 16" in md


@pytest.mark.parametrize("attention,n_kv", [("mha", 4), ("gqa", 2), ("mqa", 1)])
def test_kv_cache_bytes_equal_formula(attention, n_kv):
    s = quick()
    shape = bench.SHAPES[s.gen_shape]
    r = sections.kv.kv_bytes(s, attention, context=24, batch_size=2)
    head_dim = shape.d_model // shape.n_heads
    assert r["n_kv"] == n_kv
    assert r["measured"] == r["formula"] == 2 * shape.n_layers * 2 * n_kv * 24 * head_dim * 4


def test_mla_cache_bytes_are_the_latent_and_rotary_key():
    s = quick()
    shape = bench.SHAPES[s.gen_shape]
    r = sections.kv.kv_bytes(s, "mla", context=24, batch_size=2)
    head_dim = shape.d_model // shape.n_heads
    assert (r["kv_rank"], r["rope_dim"]) == (4 * head_dim, head_dim // 2)  # the defaults, RoPE
    assert r["measured"] == r["formula"] == shape.n_layers * 2 * 24 * (4 * head_dim + head_dim // 2) * 4


def test_kv_section_reports_matches():
    md = sections.kv.section_kv(bench.Session(quick()))
    rows = rows_of(md, "| attention | n_kv | layers | head_dim | bytes/token/layer | T | bytes |")
    assert [r["attention"] for r in rows] == ["mha", "gqa", "mqa", "mla"]
    assert all(r["match"] == "yes" and r["bytes"] == r["formula"] for r in rows)
    assert [r["vs mha"] for r in rows] == ["1.00x", "0.50x", "0.25x", "0.56x"]  # mla: (32 + 4) / (2 * 4 * 8)
    assert [r["bytes/token/layer"] for r in rows] == ["256", "128", "64", "144"]
    latency = rows_of(md, "| attention | ms/token |")
    assert [r["attention"] for r in latency] == ["mha", "gqa", "mqa", "mla"] and latency[0]["mha / this"] == "1.00x"
    for r in latency:
        positive(r["ms/token"])


def test_mfu_section_table():
    md = sections.mfu.section_mfu(bench.Session(quick()))
    rows = rows_of(md, "| shape | family | mode | GFLOP/step | median ms | achieved GFLOP/s | peak GFLOP/s | MFU |")
    assert {r["mode"] for r in rows} == {"fp32 eager", "bf16 eager"}
    for r in rows:
        for col in ("GFLOP/step", "median ms", "achieved GFLOP/s", "peak GFLOP/s"):
            positive(r[col])
        assert r["MFU"].endswith("%")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_memory_probe_in_process():
    r = sections.memory.memory_probe("tiny", "zoo-llama", quick())
    assert r["before_mib"] > 0 and r["delta_mib"] >= 0 and r["params"] > 0


def test_sections_train_with_python_m_zoo_train_from_any_directory(tmp_path, monkeypatch):
    """The training sections run `python -m zoo train` (a wheel install has no train.py), from the user's directory,
    with the zoo this process imported (a clone's, through PYTHONPATH) whatever the child's working directory."""
    assert processes.TRAIN == (sys.executable, "-m", "zoo", "train")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    env = processes.child_env()
    where = subprocess.run([sys.executable, "-c", "import zoo; print(zoo.__file__)"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert where.stdout.strip() == str(ROOT / "zoo" / "__init__.py"), where
    bad = zygote.run([*processes.TRAIN, "ffn=nope"], cwd=tmp_path, env=env, capture_output=True, text=True,
                     timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("error: ffn: unknown option 'nope'; valid: "), bad
    assert list(tmp_path.iterdir()) == []  # refused before Hydra made a run directory
    assert processes.shown(["experiment=nanogpt_cpu", "trainer.max_steps=3"]) == \
        "python train.py experiment=nanogpt_cpu trainer.max_steps=3"  # how a clone's user types it


def test_overhead_reads_summary_of_a_stand_in_training_command(tmp_path):
    """A stand-in for `python -m zoo train` that writes summary.json where the real one will, and prints its run
    directory."""
    model = bench.zoo_config(bench.SHAPES["tiny"], "gpt2")
    summary = {"tokens_per_second": 1234.5, "wall_time_s": 2.5, "time_to_first_step_s": 0.75, "model": model,
               "data": {"batch_size": 2, "context": 16}}
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(textwrap.dedent(f"""
        import json, pathlib, sys
        assert "experiment=nanogpt_cpu" in sys.argv and "trainer.max_steps=3" in sys.argv, sys.argv
        run = pathlib.Path("outputs/run1")
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({json.dumps(summary)}))
        print("run directory:", run)
    """))
    md = sections.overhead.bench_train_overhead(quick(overhead_steps=3, threads=1), workdir=tmp_path,
                                                train=(sys.executable, str(stand_in)))
    assert "outputs/run1/summary.json" in md, md
    rows = rows_of(md, "| run | tokens/s | time to first step s |")
    assert rows[0]["tokens/s"] == "1234" or rows[0]["tokens/s"] == "1235"
    assert rows[0]["time to first step s"] == "0.75"
    positive(rows[1]["tokens/s"])
    positive(rows[1]["time to first step s"])


def test_precision_compares_bf16_with_float32_runs(tmp_path):
    """A stand-in training command whose loss and speed depend on trainer.precision, as the real one's do."""
    stand_in = tmp_path / "stand_in.py"
    stand_in.write_text(textwrap.dedent("""
        import json, pathlib, sys
        bf16 = "trainer.precision=bf16-mixed" in sys.argv
        assert "model.d_model=384" in sys.argv and "trainer.max_steps=4" in sys.argv, sys.argv
        run = pathlib.Path("outputs/bf16" if bf16 else "outputs/fp32")
        run.mkdir(parents=True)
        summary = {"final": {"val_loss": 2.02 if bf16 else 2.0}, "tokens_per_second": 300.0 if bf16 else 200.0}
        (run / "summary.json").write_text(json.dumps(summary))
        print("run directory:", run)
    """))
    md = sections.precision.section_precision(bench.Session(quick()), workdir=tmp_path,
                                              train=(sys.executable, str(stand_in)))
    rows = rows_of(md, "| precision | final val_loss |")
    assert [r["final val_loss"] for r in rows] == ["2.0000", "2.0200"]
    assert "relative to float32: **+1.00%**; throughput **1.50x**" in md


def test_cli_writes_report(tmp_path):
    out = tmp_path / "docs" / "benchmarks.md"
    assert bench.main(["--quick", "--only", "kv", "--gen-shape", "tiny", "--kv-context", "16",
                       "--out", str(out)]) == 0
    md = out.read_text()
    assert md.startswith("# Benchmarks")
    assert "python -m zoo.bench --quick --only kv" in md
    assert "| torch |" in md and "| transformers |" in md
    headings = [line for line in md.splitlines() if line.startswith("#")]
    assert headings[1].startswith("## Processor kind: ") and headings[2].startswith("### KV-cache size (")
    assert "Training step" not in md


def test_an_unknown_section_is_one_line_and_exit_code_2(capsys):
    assert bench.main(["--only", "kv,nope", "--out", "-"]) == 2
    assert capsys.readouterr().err == f"error: --only: unknown section 'nope'; valid: {', '.join(SECTIONS.names())}\n"


def test_python_m_zoo_bench_refuses_an_unknown_section_with_exit_code_2():
    proc = zygote.run([sys.executable, "-m", "zoo.bench", "--only", "nope", "--out", "-"], capture_output=True,
                      text=True, timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error: --only: unknown section 'nope'; valid: train, compile,")
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""


def test_each_section_file_registers_one_section_of_its_name():
    files = sorted(p.stem for p in Path(sections.__file__).parent.glob("*.py") if p.stem != "__init__")
    assert sorted(SECTIONS.names()) == files
    for name in SECTIONS.names():
        assert SECTIONS.get(name).__module__ == f"zoo.bench.sections.{name}"
    with pytest.raises(KeyError, match="'kv' is already registered"):
        SECTIONS.register("kv")(lambda sess: "")


def test_every_registered_section_is_reachable_by_only(tmp_path, monkeypatch):
    ran = _fake_sections(monkeypatch, load=0.5)
    for name in SECTIONS.names():
        assert bench.main(["--only", name, "--out", str(tmp_path / "report.md")]) == 0
    assert ran == SECTIONS.names()
    ran.clear()  # and no --only is every section, in the registry's order
    assert bench.main(["--out", str(tmp_path / "report.md")]) == 0
    assert ran == SECTIONS.names()


def test_no_file_of_the_benchmark_is_over_400_lines():
    files = sorted(Path(bench.__file__).parent.rglob("*.py"))
    assert len(files) > len(SECTIONS.names())
    assert not {str(p): n for p in files if (n := len(p.read_text().splitlines())) > 400}


def test_variant_keys_round_trip():
    for v in (bench.Variant("zoo", "gpt2"), bench.Variant("nanogpt", "gpt2", bf16=True, compile=True),
              bench.Variant("hf", "llama", bf16=True)):
        assert bench.Variant.parse(v.key) == v
    json.dumps(machine_info(quick()))  # plain strings only


def test_norm_section_times_both_norms():
    md = sections.norm.section_norm(bench.Session(quick()))
    rows = rows_of(md, "| shape | activations |")
    assert [r["shape"] for r in rows] == ["tiny"]
    positive(rows[0]["LayerNorm ms"])
    positive(rows[0]["RMSNorm ms"])


def _fake_sections(monkeypatch, load: float, kind: str = "AVX-512 BF16") -> list[str]:
    """Every registered section replaced by one that returns a fixed text at once, on a machine of processor kind
    `kind` whose load average is `load`; the names of the sections run, in order."""
    ran: list[str] = []
    fake = SectionRegistry("section")
    for name in SECTIONS.names():
        fake.register(name)(lambda sess, n=name: ran.append(n) or f"## Section {n}\n\nnew {n}\n")
    monkeypatch.setattr(cli, "SECTIONS", fake)
    monkeypatch.setattr(cli, "load_value", lambda text=None: load)
    monkeypatch.setattr(cli, "kind_label", lambda s: kind)
    return ran


def _block(doc: str, kind: str) -> str:
    """A kind's generated block, markers included."""
    begin, end = writer.markers(kind)
    return doc[doc.index(begin):doc.index(end) + len(end)]


def test_a_run_of_some_sections_replaces_only_those_in_an_existing_report(tmp_path, monkeypatch):
    _fake_sections(monkeypatch, load=0.5)
    out = tmp_path / "benchmarks.md"
    cli.run_sections(SECTIONS.names(), Settings(), [], out, echo=False)
    full = out.read_text()
    out.write_text(full.replace("new kv", "old kv").replace("new norm", "old norm"))
    cli.run_sections(["kv"], Settings(), ["--only", "kv"], out, echo=False)
    text = out.read_text()
    assert "new kv" in text and "old kv" not in text  # the section that ran is replaced
    assert "old norm" in text  # the others keep their earlier run
    assert text.count("### Section") == len(SECTIONS.names())
    assert "### Section kv (AVX-512 BF16)\n" in text
    assert "_This section alone: `python -m zoo.bench --only kv` on " in text


def test_each_processor_kind_has_its_own_block_and_a_run_rewrites_only_its_own(tmp_path, monkeypatch):
    """A run on another kind of CPU adds that kind's block and leaves the first kind's as it was, byte for byte; a
    rerun on a kind replaces that kind's copy only, and a full run on a kind rewrites that kind's block alone."""
    _fake_sections(monkeypatch, load=0.5, kind="AVX-512 BF16")
    out = tmp_path / "benchmarks.md"
    cli.run_sections(SECTIONS.names(), Settings(), [], out, echo=False)
    first = out.read_text()
    monkeypatch.setattr(cli, "kind_label", lambda s: "AMX")
    cli.run_sections(["train", "kv"], Settings(), ["--only", "train,kv"], out, echo=False)
    text = out.read_text()
    assert text.startswith(first)
    amx = [line for line in text[len(first):].splitlines() if line.startswith("#")]
    assert amx == ["## Processor kind: AMX", "### Section train (AMX)", "### Section kv (AMX)"]
    out.write_text(text.replace("new train", "old train"))
    cli.run_sections(["train"], Settings(), ["--only", "train"], out, echo=False)
    text = out.read_text()
    assert "old train" in _block(text, "AVX-512 BF16")  # the other kind's run is kept
    assert "new train" in _block(text, "AMX") and "old train" not in _block(text, "AMX")
    cli.run_sections(SECTIONS.names(), Settings(), [], out, echo=False)  # a full run on AMX
    assert _block(out.read_text(), "AVX-512 BF16") == _block(text, "AVX-512 BF16")
    assert _block(out.read_text(), "AMX").count("### Section") == len(SECTIONS.names())


def _kinds(doc: str) -> list[str]:
    """The processor kinds a report has a block for, in its order."""
    return re.findall(r"^<!-- zoo.bench (.+): generated, ", doc, re.M)


def _kind_section(doc: str, kind: str) -> tuple[str, str]:
    """A kind's whole section: its generated block (markers included), then what follows its end marker up to the
    next kind's block (the figures measured by hand on that kind)."""
    begin, end = writer.markers(kind)
    stop = doc.index(end) + len(end)
    nxt = doc.find("<!-- zoo.bench ", stop)
    return doc[doc.index(begin):stop], doc[stop:nxt if nxt >= 0 else len(doc)]


def test_the_real_report_has_one_section_per_kind_with_its_hand_measured_figures():
    """docs/benchmarks.md: every heading that names a processor kind lies in that kind's section, and each kind has
    figures measured by hand after its block."""
    real = (ROOT / "docs" / "benchmarks.md").read_text()
    kinds = _kinds(real)
    assert kinds == ["AVX-512 BF16", "AMX"]
    for kind in kinds:
        block, hand = _kind_section(real, kind)
        assert hand.lstrip().startswith("### ") and f"({kind})\n" in hand, kind
        for heading in re.findall(rf"^#+ .*\({re.escape(kind)}\)$", real, re.M):
            assert heading in block + hand, (kind, heading)


@pytest.mark.parametrize("kind", ["AVX-512 BF16", "AMX"])
@pytest.mark.parametrize("only", [None, ["train", "kv"]], ids=["full", "some"])
def test_a_run_on_one_kind_leaves_the_other_kinds_section_of_the_real_report_byte_identical(tmp_path, monkeypatch,
                                                                                           kind, only):
    """docs/benchmarks.md itself, copied: a run on one kind (every section, or some) rewrites only that kind's
    generated block; the other kind's whole section, hand-measured figures included, this kind's hand-measured
    figures, and the title and what precedes the first block stay byte for byte."""
    real = (ROOT / "docs" / "benchmarks.md").read_text()
    out = tmp_path / "benchmarks.md"
    out.write_text(real)
    _fake_sections(monkeypatch, load=0.5, kind=kind)
    cli.run_sections(only or SECTIONS.names(), Settings(), ["--only", ",".join(only)] if only else [], out,
                     echo=False)
    text = out.read_text()
    for other in _kinds(real):
        if other != kind:
            assert _kind_section(text, other) == _kind_section(real, other)
    assert _kind_section(text, kind)[1] == _kind_section(real, kind)[1]
    assert "new train" in _kind_section(text, kind)[0]
    first = writer.markers(_kinds(real)[0])[0]
    assert text[:text.index(first)] == real[:real.index(first)]
    assert _kinds(text) == _kinds(real)


def test_a_report_with_a_broken_block_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys):
    ran = _fake_sections(monkeypatch, load=0.5, kind="AMX")
    out = tmp_path / "benchmarks.md"
    out.write_text(f"# Benchmarks\n\n{writer.markers('AMX')[0]}\n## Processor kind: AMX\n")  # its end marker lost
    assert bench.main(["--only", "kv", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the report's block for 'AMX' is not one begin marker followed by one end marker")
    assert err.count("\n") == 1 and ran == []
    with pytest.raises(ConfigError, match="found 1 and 0"):
        writer.write(out.read_text(), "AMX", {"kv": "## Section kv\n"}, [], [], whole=False)


def test_nothing_is_written_under_docs_from_a_busy_machine(tmp_path, monkeypatch, capsys):
    _fake_sections(monkeypatch, load=2.0 * (os.cpu_count() or 1) + 1)
    out = tmp_path / "docs" / "benchmarks.md"
    out.parent.mkdir()
    out.write_text("# Benchmarks\n\nkept\n")
    cli.run_sections(["kv"], Settings(), ["--only", "kv"], out, echo=False)
    assert out.read_text() == "# Benchmarks\n\nkept\n"
    said = capsys.readouterr().out
    assert "not written to" in said and "wrote" not in said
    elsewhere = tmp_path / "busy.md"  # outside docs/ the numbers are written, with their load averages
    cli.run_sections(["kv"], Settings(), ["--only", "kv"], elsewhere, echo=False)
    assert "new kv" in elsewhere.read_text()


def test_data_section_tables():
    md = sections.data.section_data(bench.Session(quick()))
    rows = rows_of(md, "| tokenizer | vocab | dtype | tokens | workers | prepare MB/s |")
    assert [(r["tokenizer"], r["dtype"], r["workers"]) for r in rows] == [("bpe", "uint16", "1"),
                                                                          ("char", "uint16", "1")]
    for r in rows:
        for col in ("tokens", "prepare MB/s", "tokenizer MB/s", "prepare time / tokenizer time"):
            positive(r[col])
    loader = rows_of(md, "| objective | batch ms | batches/s |")
    assert [r["objective"] for r in loader] == ["decoder_only", "encoder_only", "encoder_decoder"]
    assert all(positive(r["batch ms"]) for r in loader)


def _ttt_text(tmp_path: Path) -> Path:
    lines = ["to be or not to be, that is the question", "whether tis nobler in the mind to suffer",
             "the slings and arrows of outrageous fortune"]
    text = tmp_path / "input.txt"
    text.write_text("\n".join(lines[i % 3] for i in range(40)) + "\n")  # its last 10%: 2 windows of 64 + 1
    return text


def _fake_nanogpt(tmp_path: Path, text: Path, evals=((0, 4.0), (250, 1.7), (500, 1.5))) -> tuple[Path, dict]:
    """A stand-in for nanoGPT: its prepare.py writes meta.pkl as nanoGPT's does (every character of the file,
    sorted); its train.py prints evaluation lines and, after each but step 0's, saves ckpt.pt (the same random
    GPT each time, keys and shapes of nanoGPT's model.py) and says so. Returns the checkout and the state dict."""
    nano = tmp_path / "nanoGPT"
    (nano / "data" / "shakespeare_char").mkdir(parents=True)
    (nano / "data" / "shakespeare_char" / "prepare.py").write_text(textwrap.dedent("""
        import pickle
        chars = sorted(set(open("input.txt").read()))
        stoi = {c: i for i, c in enumerate(chars)}
        pickle.dump({"vocab_size": len(chars), "stoi": stoi, "itos": dict(enumerate(chars))}, open("meta.pkl", "wb"))
        open("train.bin", "w").write("x")
    """))
    (nano / "configurator.py").write_text("")
    args = dict(n_layer=1, n_head=2, n_embd=8, block_size=64, bias=False, vocab_size=len(set(text.read_text())),
                dropout=0.0)
    g = torch.Generator().manual_seed(0)
    sd = {"transformer.wte.weight": torch.randn(args["vocab_size"], 8, generator=g),
          "transformer.wpe.weight": torch.randn(64, 8, generator=g), "transformer.ln_f.weight": torch.ones(8)}
    for name, shape in (("ln_1", (8,)), ("attn.c_attn", (24, 8)), ("attn.c_proj", (8, 8)), ("ln_2", (8,)),
                        ("mlp.c_fc", (32, 8)), ("mlp.c_proj", (8, 32))):
        sd[f"transformer.h.0.{name}.weight"] = torch.randn(*shape, generator=g)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    torch.save({"model": sd, "model_args": args}, nano / "weights.pt")
    (nano / "train.py").write_text(textwrap.dedent(f"""
        import os, pathlib, shutil, sys, time
        assert os.path.exists("configurator.py") and os.path.exists("data/shakespeare_char/meta.pkl")
        assert "--device=cpu" in sys.argv and sys.argv[1].endswith("train_shakespeare_char.py"), sys.argv
        assert "--always_save_checkpoint=True" in sys.argv, sys.argv
        out = pathlib.Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--out_dir=")))
        out.mkdir(exist_ok=True)
        for step, val in {tuple(evals)!r}:
            print(f"step {{step}}: train loss {{val + 0.1:.4f}}, val loss {{val:.4f}}", flush=True)
            if step:
                print(f"saving checkpoint to {{out}}", flush=True)
                shutil.copy({str(nano / "weights.pt")!r}, out / "ckpt.pt")
            time.sleep(0.3)
            print(f"iter {{step}}: loss 1.0", flush=True)
    """))
    return nano, sd


_ZOO_STAND_IN = textwrap.dedent("""
    import json, os, pathlib, sys, time
    import torch
    import zoo
    from zoo.data.corpus import read_text_file, split_text
    from zoo.data.tokenizers import CharTokenizer
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith("inductor")  # the section's own, empty at its start
    run = pathlib.Path(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("hydra.run.dir=")))
    text = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("data.path="))
    assert "data=text_file" in sys.argv and any(a.startswith("experiment=nanogpt_cpu") for a in sys.argv), sys.argv
    fp32 = "trainer.precision=32-true" in sys.argv
    tok = CharTokenizer().fit(split_text(read_text_file(text))[0])
    cfg = dict(name="decoder_only", vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2, max_seq_len=64,
               dropout=0.0)
    model = zoo.build_model(cfg)
    (run / "checkpoints").mkdir(parents=True)
    started = time.time()
    for step in (250, 500):
        with torch.no_grad():  # float32's last: every weight zero, the uniform distribution; else far worse
            for p in model.parameters():
                p.zero_() if fp32 and step == 500 else p.normal_(0, 10.0)
        ckpt = {"hyper_parameters": {"cfg": {"model": cfg}}, "global_step": step, "tokenizer": tok.state_dict(),
                "state_dict": {"model." + k: v for k, v in model.state_dict().items()}}
        torch.save(ckpt, run / "checkpoints" / "tmp")
        os.replace(run / "checkpoints" / "tmp", run / "checkpoints" / "last.ckpt")  # as zoo's: a rename
        time.sleep(0.3)
    history = [{"step": 250, "val_loss": 1.7, "wall_time_s": 0.4},
               {"step": 500, "val_loss": 1.5 if fp32 else 1.65, "wall_time_s": time.time() - started}]
    summary = {"wall_time_s": time.time() - started + 0.1, "eval_time_s": 0.1, "history": history}
    (run / "summary.json").write_text(json.dumps(summary))
""")


@pytest.mark.parametrize("given", [9.0, None])
def test_ttt_times_both_programs_to_the_target(tmp_path, given):
    """Stand-ins for nanoGPT's train.py (evaluation lines on stdout, a ckpt.pt after each) and zoo's (summary.json
    with each evaluation's wall time, checkpoints/last.ckpt replaced at each): every checkpoint is scored on the
    yardstick, the target is the one given or nanoGPT's final model's score, checked here against GPT-2's forward
    written out in tests/test_bench_yardstick.py; the same checkpoint scored twice (nanoGPT's 250 and 500) gives
    the same number; zoo's uniform model scores log(vocabulary)."""
    from test_bench_yardstick import gpt2_logits

    text = _ttt_text(tmp_path)
    nano, sd = _fake_nanogpt(tmp_path, text)
    stand_in = tmp_path / "zoo_train.py"
    stand_in.write_text(_ZOO_STAND_IN)
    md = sections.ttt.section_ttt(bench.Session(quick(nanogpt=nano, text=text, ttt_target=given, ttt_pairs=2,
                                                      ttt_runs=("defaults", "float32"))),
                                  train=(sys.executable, str(stand_in)))
    scores = {r["contender"]: r for r in rows_of(md, "| contender | yardstick, final (each round) |")}
    rows = {r["contender"]: r for r in rows_of(md, "| contender | time to target s (each round) |")}
    assert set(rows) == set(scores) == {"nanoGPT", "zoo, defaults", "zoo, float32"}, md
    # nanoGPT's final model on the yardstick, by hand: its characters, the windows, the forward written out
    content = text.read_text()
    cut = int(len(content) * 0.9)
    val = content[cut:]
    stoi = {c: i for i, c in enumerate(sorted(set(content)))}
    ids = torch.tensor([stoi[c] for c in val[:2 * 64 + 1]])
    logits = gpt2_logits({k: v.double() for k, v in sd.items()}, dict(n_embd=8, n_head=2, n_layer=1),
                         ids[:-1].view(2, 64))
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[1:]).item()
    assert "2 non-overlapping windows of 64 characters" in md
    target = given if given else want
    assert f"**The target: {target:.4f}** " + ("(given)" if given else "(nanoGPT's final model") in md, md
    assert scores["nanoGPT"]["yardstick, final (each round)"] == f"{want:.4f}, {want:.4f}"
    assert scores["nanoGPT"]["median ± SE (windows)"].startswith(f"{want:.4f} ± ")
    assert scores["nanoGPT"]["own estimate, final"] == "1.5000"
    curve = next(ln for ln in md.splitlines() if ln.startswith("- nanoGPT: "))
    assert curve == f"- nanoGPT: 250: {want:.4f} (1.7000), 500: {want:.4f} (1.5000)"  # one model, twice
    vocab = len(set(content[:cut])) + 20  # zoo's char tokenizer: the training split's characters after 20 specials
    assert scores["zoo, float32"]["yardstick, final (each round)"] == ", ".join([f"{math.log(vocab):.4f}"] * 2)
    assert float(scores["zoo, defaults"]["yardstick, final (each round)"].split(", ")[0]) > target
    # nanoGPT reaches its own final model's score at its first checkpoint (the same model), timed from the spawn
    nano_times = [float(x) for x in rows["nanoGPT"]["time to target s (each round)"].split(", ")]
    assert len(nano_times) == 2 and all(0 < t < float(rows["nanoGPT"]["process wall s"]) for t in nano_times)
    assert rows["nanoGPT"]["step reached"] == "250, 250" and rows["nanoGPT"]["vs nanoGPT"] == "1.00x"
    fp32 = rows["zoo, float32"]
    assert fp32["step reached"] == "500, 500" and fp32["eval share"].endswith("%"), md
    assert all(0 < float(t) < float(fp32["process wall s"]) for t in fp32["time to target s (each round)"].split(", "))
    positive(fp32["SE s (rounds)"])
    assert rows["zoo, defaults"]["time to target s (each round)"] == "not reached, not reached"
    assert rows["zoo, defaults"]["median s"] == "-" and scores["zoo, defaults"]["own estimate, final"] == "1.6500"


def test_ttt_margin_times_zoo_to_the_target_less_it_and_nanogpt_to_the_target(tmp_path, capsys):
    """--ttt-margin: zoo's uniform model (float32's stand-in, log(vocabulary) on the yardstick) reaches a target
    just above its score, but not that target less a margin that puts it below; nanoGPT is still timed to the
    target itself. A negative margin is refused in one line."""
    text = _ttt_text(tmp_path)
    nano, _ = _fake_nanogpt(tmp_path, text)
    stand_in = tmp_path / "zoo_train.py"
    stand_in.write_text(_ZOO_STAND_IN)
    content = text.read_text()
    uniform = math.log(len(set(content[:int(len(content) * 0.9)])) + 20)
    for margin, reached in ((0.0, True), (0.02, False)):
        md = sections.ttt.section_ttt(bench.Session(quick(nanogpt=nano, text=text, ttt_target=9.0, ttt_pairs=1,
                                                          ttt_margin=9.0 - uniform - 0.01 + margin,
                                                          ttt_runs=("float32",))),
                                      train=(sys.executable, str(stand_in)))
        rows = {r["contender"]: r for r in rows_of(md, "| contender | time to target s (each round) |")}
        assert rows["nanoGPT"]["step reached"] == "250", md
        assert (rows["zoo, float32"]["step reached"] == "500") is reached, md
        assert f"less a margin of {9.0 - uniform - 0.01 + margin:g}" in md
    assert bench.main(["--only", "ttt", "--ttt-margin", "-0.1", "--out", "-"]) == 2
    assert capsys.readouterr().err == "error: --ttt-margin: got -0.1; valid: a loss difference >= 0\n"


def test_ttt_runs_names_zoos_contenders(tmp_path, capsys):
    """--ttt-runs keeps nanoGPT and just the zoo contenders named; an unknown name is refused in one line."""
    text = _ttt_text(tmp_path)
    nano, _ = _fake_nanogpt(tmp_path, text, evals=((20, 1.5),))
    stand_in = tmp_path / "zoo_train.py"
    stand_in.write_text("import sys; print(sys.argv); sys.exit(3)\n")
    md = sections.ttt.section_ttt(bench.Session(quick(nanogpt=nano, text=text, ttt_runs=("fast",))),
                                  train=(sys.executable, str(stand_in)))
    rows = rows_of(md, "| contender | time to target s (each round) |")
    assert [r["contender"] for r in rows] == ["nanoGPT", "zoo, fast preset"], md
    assert "Failed: zoo, fast preset: `" in md and "` exited 3" in md and "compile=true" not in md
    assert bench.main(["--only", "ttt", "--ttt-runs", "fast,nope", "--out", "-"]) == 2
    valid = "defaults, float32, fast, margin, fast_compiled"
    assert capsys.readouterr().err == f"error: --ttt-runs: unknown 'nope'; valid: {valid}\n"


def test_ttt_skipped_without_nanogpt_or_text(tmp_path):
    assert "skipped: needs `--nanogpt" in sections.ttt.section_ttt(bench.Session(quick()))
    md = sections.ttt.section_ttt(bench.Session(quick(nanogpt=tmp_path, text=tmp_path / "missing.txt")))
    assert "no such file" in md


def test_profile_section_shares_add_up():
    md = sections.profile.section_profile(bench.Session(quick()))
    rows = rows_of(md, "| shape | family | mode | profiled ms |")
    modes = ["fp32 eager", "bf16 eager", "bf16 compile"]
    assert [(r["family"], r["mode"]) for r in rows] == [(f, m) for f in ("GPT-2 style", "Llama style") for m in modes]
    groups = [name for name, _ in sections.profile.PROFILE_GROUPS] + ["other"]
    for r in rows:
        positive(r["profiled ms"])
        assert 97 <= sum(int(r[g].rstrip("%")) for g in groups) <= 103, r  # rounded shares of one whole
        assert (int(r["inductor's kernels"].rstrip("%")) > 0) == (r["mode"] == "bf16 compile"), r  # its own kernels
    assert any(int(r["matmul"].rstrip("%")) > 0 for r in rows), rows  # a training step multiplies matrices


def test_choices_section_tables():
    """The rows behind zoo.kernels.attention's rules: both attention paths per family, by key length, and the
    three AdamW kernels, with the for-loop equal to itself and foreach equal to it to the bit (the same
    arithmetic, batched)."""
    md = sections.choices.section_choices(bench.Session(quick()))
    assert md.startswith("## Hardware choices\n")  # run_sections adds the CPU kind to the heading
    built = KERNELS.get("attention_softmax_cpp").load()
    forms = ["zoo's softmax", "torch ops"] if built else ["torch ops"]  # its written-out forms
    rows = rows_of(md, f"| shape | family | context | kernel ms | written-out ms ({forms[0]}) |")
    assert [r["family"] for r in rows] == ["GPT-2 style", "Llama style"]
    lengths = rows_of(md, "| key length |")
    assert [r["key length"] for r in lengths] == ["8", "16"]
    for r in rows + lengths:
        positive(r["kernel ms"])
        for form in forms:
            positive(r[f"written-out ms ({form})"])
            assert r[f"rule picks ({form})"].split()[0] in ("kernel", "written-out")
    adamw = {r["kernel"]: r for r in rows_of(md, "| shape | params | kernel |")}
    assert set(adamw) == set(sections.choices.ADAMW_KERNELS)
    assert [adamw[k]["equal to for-loop"] for k in ("for-loop (torch's CPU default)", "foreach")] == ["yes", "yes"]
    compiled = rows_of(md, "| key length | zoo's softmax ms |") if "zoo's softmax" in forms else []
    assert [r["key length"] for r in compiled] == (["8", "16"] if compiled else [])
    for r in compiled:
        positive(r["zoo's softmax ms"])
        positive(r["inductor's ms"])
        assert r["rule picks"].split()[0] in ("zoo's", "inductor's")
    said = [ln for ln in md.splitlines() if ln.startswith("Compiled, the rule ")]
    assert len(said) == bool(compiled) and all(ln.endswith(("at every length.", "COMPILED_SOFTMAX_KERNEL_FROM."))
                                                for ln in said), said
    for form, (_, rule_table) in sections.choices.SOFTMAXES.items():  # each form's verdict on its own rule table
        said = [ln for ln in md.splitlines() if ln.startswith(f"Against the written-out form with {form}, ")]
        assert len(said) == (form in forms), form
        revisit = f"revisit zoo.kernels.attention.{rule_table}."
        assert all(ln.endswith(("at every length.", revisit)) for ln in said), said


@pytest.mark.parametrize("rule,t,kernel,written,verdict", [
    (None, 64, 2.0, 1.0, "written-out (faster)"), (256, 64, 2.0, 1.0, "written-out (faster)"),
    (256, 256, 1.0, 2.0, "kernel (faster)"), (256, 256, 1.04, 1.0, "kernel (within 5%)"),
    (256, 512, 2.0, 1.0, "kernel (**slower**)"), (None, 512, 1.0, 2.0, "written-out (**slower**)")])
def test_choices_verdict(rule, t, kernel, written, verdict):
    assert sections.choices._verdict(rule, t, kernel, written) == verdict
    named = verdict.replace("written-out", "inductor's").replace("kernel", "zoo's softmax")
    assert sections.choices._verdict(rule, t, kernel, written, ("zoo's softmax", "inductor's")) == named
