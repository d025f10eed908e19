"""A damaged or crafted pretrained directory, tried file by file and damage by damage.

For every file of a save_pretrained directory that zoo reads (or has transformers read) and one it does not
(generation_config.json), each damage (a symbolic link out of the directory, a directory where the file belongs,
a truncated file, flipped bytes) goes through every entry point: zoo.convert.from_pretrained (ConversionError),
zoo.eval's loader (EvalError) and init_from's checks before any data (ConfigError, or DataError from the
tokenizer). Each ends in one line naming the problem, or, where the entry point does not read that file, in a
model that loads. A few rows run the real CLIs (exit code 2, one `error:` line). A marker directory outside holds
the targets of the links: nothing in it is opened (inotify) or changed; nothing is written into the pretrained
directory either (zoo only reads it, so a read-only or full disk there changes nothing).

The models are tiny GPT-2s with random weights and a BPE trained on the spot: nothing is downloaded."""

import ctypes
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from tests.helpers import compose_cfg
from zoo.build import ConfigError
from zoo.data.corpus import DataError

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

from tests.training.test_pretrained import hf_model, save_tokenizer  # noqa: E402
from zoo.convert import ConversionError, _Safetensors, from_pretrained  # noqa: E402
from zoo.eval import EvalError, load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARD = "model-00002-of-00003.safetensors"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    """"single": model.safetensors; "sharded": an index and 3 shards; both with the tokenizer's files."""
    root = tmp_path_factory.mktemp("pristine")
    out = {}
    for layout, kw in (("single", {}), ("sharded", {"max_shard_size": "60KB"})):
        tok = save_tokenizer("gpt2", root / layout)
        hf_model("gpt2", tok).save_pretrained(root / layout, **kw)
        out[layout] = root / layout
    assert (out["sharded"] / SHARD).is_file()
    text = root / "text.txt"
    text.write_text("To be, or not to be, that is the question. " * 200)
    out["text"] = text
    return out


class Watch:
    """Whether anything opened or read a file in `directory` since the last call (Linux inotify): a link that was
    followed would show here even when the reader is native code (the safetensors or tokenizers libraries)."""

    IN_ACCESS, IN_OPEN = 0x1, 0x20

    def __init__(self, directory: Path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, str(directory).encode(), self.IN_ACCESS | self.IN_OPEN) < 0:
            pytest.skip("needs Linux inotify")

    def touched(self) -> bool:
        try:
            return len(os.read(self.fd, 1 << 16)) > 0
        except BlockingIOError:
            return False

    def close(self) -> None:
        os.close(self.fd)


def snapshot(directory: Path) -> dict:
    """Every entry's content (a link's target, a directory's names) and modification time."""
    def content(p: Path):
        if p.is_symlink():
            return str(p.readlink())
        return sorted(c.name for c in p.iterdir()) if p.is_dir() else p.read_bytes()
    return {p.name: (content(p), p.lstat().st_mtime_ns) for p in sorted(directory.iterdir())}


# ---- damages: each takes (the file, the marker directory outside) and changes the file in place

def link_out(path: Path, outside: Path) -> None:
    """The file becomes a link to an intact copy of itself outside: followed, it would load."""
    target = outside / path.name
    shutil.copyfile(path, target)
    path.unlink()
    path.symlink_to(target)


def dir_for_file(path: Path, outside: Path) -> None:
    path.unlink()
    path.mkdir()


def truncated(path: Path, outside: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def flip_header(path: Path, outside: Path) -> None:
    """Flip a byte of a safetensors file's JSON header, or a JSON file's first byte ('{' becomes invalid UTF-8)."""
    data = bytearray(path.read_bytes())
    data[8 + 2 if path.suffix == ".safetensors" else 0] ^= 0xFF
    path.write_bytes(bytes(data))


def nan_data(path: Path, outside: Path) -> None:
    """The first float32 of a safetensors file's data becomes a NaN (all bits set)."""
    data = bytearray(path.read_bytes())
    start = 8 + struct.unpack("<Q", data[:8])[0]
    data[start:start + 4] = b"\xff\xff\xff\xff"
    path.write_bytes(bytes(data))


def flip_data(path: Path, outside: Path) -> None:
    """Flip the low byte of the last float32: a finite value that safetensors (no checksum) cannot tell apart."""
    data = bytearray(path.read_bytes())
    data[-4] ^= 0xFF
    path.write_bytes(bytes(data))


# ---- the table: (layout, file, damage, the entry points that read it, the expected line)

LINK = r"a symbolic link to .*, outside .*; zoo reads no file outside a pretrained directory"
NOT_FILE = r": not a regular file \(a directory, FIFO or device where a file belongs\)$"
NOT_JSON = r"\.json: is not JSON \("
NOT_ST = r": not a valid safetensors file \(Error while deserializing header: "
NAN = r"holds NaN or infinite values: the file is damaged$"
ALL = ("api", "eval", "init_from")  # config and weights: every entry point reads them
TOKENS = ("eval", "init_from")  # from_pretrained reads no tokenizer
NONE = ()  # generation_config.json: nothing reads it

FILES = {  # file -> (layout, entry points that read it, expected line for a truncated or flipped-header file)
    "config.json": ("single", ALL, NOT_JSON),
    "model.safetensors": ("single", ALL, NOT_ST),
    "model.safetensors.index.json": ("sharded", ALL, NOT_JSON),
    SHARD: ("sharded", ALL, NOT_ST),
    "tokenizer.json": ("single", TOKENS, "tokenizer"),
    "tokenizer_config.json": ("single", TOKENS, "tokenizer"),
    "generation_config.json": ("single", NONE, None),
}


def table() -> list:
    rows = []
    for file, (layout, readers, damaged) in FILES.items():
        # a link out or a directory in the file's place is refused wherever the directory is read, read or not
        rows += [(layout, file, link_out, ALL, LINK), (layout, file, dir_for_file, ALL, NOT_FILE),
                 (layout, file, truncated, readers, damaged), (layout, file, flip_header, readers, damaged)]
        if file.endswith(".safetensors"):
            rows += [(layout, file, nan_data, readers, NAN),
                     (layout, file, flip_data, NONE, None)]  # the documented limit: the format has no checksum
    return [pytest.param(*r, id=f"{r[1]}-{r[2].__name__}") for r in rows]


def init_from(directory: Path, text: Path) -> None:
    """What train.py init_from=hf:<dir> does before training: the run config (checkpoint checked before any
    data), the data, the model, the converted weights."""
    from zoo.build import build_model
    from zoo.training.pretrained import load_weights
    from zoo.training.sizing import prepare_run

    plain = OmegaConf.to_container(compose_cfg([f"init_from=hf:{directory}", "data=text_file", f"data.path={text}",
                                                "data.context=32"]), resolve=True)
    prepare_run(plain)
    load_weights(build_model(plain["model"]), str(directory))


ENTRY_POINTS = {
    "api": (lambda directory, text: from_pretrained(directory), ConversionError),
    "eval": (lambda directory, text: load_model(f"hf:{directory}"), EvalError),
    "init_from": (init_from, (ConfigError, DataError)),
}


def damaged_copy(pristine: dict, layout: str, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of a pristine directory, and a directory outside it holding a marker file."""
    directory, outside = tmp_path / "model", tmp_path / "outside"
    shutil.copytree(pristine[layout], directory)
    outside.mkdir()
    (outside / "marker").write_text("zoo must not read or change this directory")
    return directory, outside


def refused(call, error, directory: Path, text: Path) -> str:
    """The one-line message `call` raises."""
    with pytest.raises(error) as e:
        call(directory, text)
    assert "\n" not in str(e.value), f"not one line: {e.value}"
    return str(e.value)


@pytest.mark.parametrize("layout, file, damage, readers, message", table())
def test_each_damaged_file_is_one_line_or_loads_where_unread(pristine, tmp_path, layout, file, damage, readers,
                                                             message):
    directory, outside = damaged_copy(pristine, layout, tmp_path)
    damage(directory / file, outside)
    before, inside = snapshot(outside), snapshot(directory)
    watch = Watch(outside)
    for name, (call, error) in ENTRY_POINTS.items():
        if name in readers:
            line = refused(call, error, directory, pristine["text"])
            assert re.search(message, line), f"{name}: {line}"
        else:  # this entry point does not read the file, or (flip_data) cannot tell: it loads
            call(directory, pristine["text"])
    assert not watch.touched(), "a file outside the directory was opened"
    watch.close()
    assert snapshot(outside) == before
    assert snapshot(directory) == inside, "zoo wrote into the pretrained directory: it only reads it"


# ---- crafted directories: the cases, and the ones each rule exists for

def header(path: Path) -> tuple[dict, bytes]:
    """A safetensors file's JSON header and its data bytes."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_safetensors(path: Path, head: dict, body: bytes) -> None:
    raw = json.dumps(head).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + body)


def pickle_only(d: Path, outside: Path) -> None:
    from safetensors.torch import load_file

    torch.save(load_file(d / "model.safetensors"), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()


def tensor_claims_4tib(d: Path, outside: Path) -> None:
    """A header whose first tensor claims 4 TiB (2**40 float32s): sizes are checked against the file before any
    allocation from the claimed shape."""
    head, body = header(d / "model.safetensors")
    name = next(k for k in head if k != "__metadata__")
    head[name] = {"dtype": "F32", "shape": [1 << 40], "data_offsets": [0, 4 << 40]}
    write_safetensors(d / "model.safetensors", head, body)


def header_claims_4tib(d: Path, outside: Path) -> None:
    data = bytearray((d / "model.safetensors").read_bytes())
    data[:8] = struct.pack("<Q", 4 << 40)
    (d / "model.safetensors").write_bytes(bytes(data))


def edit_weights(edit):
    def damage(d: Path, outside: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(d / "model.safetensors")
        edit(tensors)
        save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    return damage


def edit_index(edit):
    def damage(d: Path, outside: Path) -> None:
        index = json.loads((d / "model.safetensors.index.json").read_text())
        edit(index["weight_map"], d, outside)
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return damage


def shard_named(name_of):
    """Every tensor of the second shard is said to be in another file, name_of(outside): a copy of that shard
    placed outside (followed, it would load), or a file that does not exist."""
    def edit(weight_map: dict, d: Path, outside: Path) -> None:
        shutil.copyfile(d / SHARD, outside / SHARD)
        for k, v in weight_map.items():
            if v == SHARD:
                weight_map[k] = name_of(outside)
    return edit


def tensor_elsewhere(weight_map: dict, d: Path, outside: Path) -> None:
    name = next(k for k, v in weight_map.items() if v == SHARD)
    weight_map[name] = next(v for v in weight_map.values() if v != SHARD)


def config_value(**values):
    def damage(d: Path, outside: Path) -> None:
        (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()), **values}))
    return damage


def fifo(name: str):
    def damage(d: Path, outside: Path) -> None:
        (d / name).unlink()
        os.mkfifo(d / name)  # opening it to read would wait for a writer forever
    return damage


CRAFTED = {  # name -> (layout, damage, expected line from every entry point)
    "pickle-only": ("single", pickle_only, r": has pytorch_model\.bin but no model\.safetensors: zoo never loads "
                    r"pickled weights \(unpickling can run code\); convert them to safetensors where you trust the "
                    r"file: transformers' from_pretrained\(dir\), then "
                    r"save_pretrained\(dir, safe_serialization=True\)$"),
    "tensor-claims-4TiB": ("single", tensor_claims_4tib, NOT_ST + r"invalid offset for tensor"),
    "header-claims-4TiB": ("single", header_claims_4tib, NOT_ST + r"header too large\)$"),
    "missing-tensor": ("single", edit_weights(lambda t: t.pop("transformer.h.1.mlp.c_fc.weight")),
                       r": tensor 'transformer\.h\.1\.mlp\.c_fc\.weight' is not in its safetensors file\(s\)$"),
    "wrong-shape": ("single", edit_weights(lambda t: t.update({"transformer.wpe.weight": torch.zeros(63, 32)})),
                    r"model\.safetensors: tensor 'transformer\.wpe\.weight' has shape \[63, 32\]; config\.json "
                    r"makes it \[64, 32\]$"),
    "shard-in-parent": ("sharded", edit_index(shard_named(lambda o: f"../{o.name}/{SHARD}")),
                        rf"index\.json: names shard '\.\./outside/{SHARD}', which is not a file name inside the "
                        r"directory$"),
    "shard-absolute": ("sharded", edit_index(shard_named(lambda o: str(o / SHARD))),
                       r"index\.json: names shard '/.*', which is not a file name inside the directory$"),
    "shard-missing": ("sharded", edit_index(shard_named(lambda o: "model-00009-of-00009.safetensors")),
                      r"index\.json: names shard 'model-00009-of-00009\.safetensors', which is missing or not a "
                      r"regular file$"),
    "tensor-not-in-its-shard": ("sharded", edit_index(tensor_elsewhere), r"index\.json: names tensor '.*' in "
                                r"model-0000\d-of-00003\.safetensors, which does not hold it$"),
    "unknown-model-type": ("single", config_value(model_type="foo"),
                           r"cannot convert model_type='foo'; supported: gpt2, bert, llama, bart, t5$"),
    "config-rejected": ("single", config_value(n_head=3), r"config\.json: transformers cannot build GPT2LMHeadModel "
                        r"from it \(`embed_dim` must be divisible by num_heads"),
    "config-fifo": ("single", fifo("config.json"), NOT_FILE),
    "weights-fifo": ("single", fifo("model.safetensors"), NOT_FILE),
    "tokenizer-fifo": ("single", fifo("tokenizer.json"), NOT_FILE),
}


@pytest.mark.parametrize("name", CRAFTED)
def test_each_crafted_directory_is_one_line_from_every_entry_point(pristine, tmp_path, name, monkeypatch):
    layout, damage, message = CRAFTED[name]
    directory, outside = damaged_copy(pristine, layout, tmp_path)
    damage(directory, outside)
    read = []
    monkeypatch.setattr(_Safetensors, "read", lambda self, key, out=None: read.append(key))  # nothing gets this far

    def unpickled(*a, **kw):
        raise AssertionError("a pickle was loaded")

    for module, attr in ((torch, "load"), (pickle, "load"), (pickle, "loads")):  # what loaders of .bin files call
        monkeypatch.setattr(module, attr, unpickled)
    before = snapshot(outside)
    watch = Watch(outside)
    for entry, (call, error) in ENTRY_POINTS.items():
        line = refused(call, error, directory, pristine["text"])
        assert re.search(message, line), f"{entry}: {line}"
    assert read == []
    assert not watch.touched(), "a file outside the directory was opened"
    watch.close()
    assert snapshot(outside) == before


def test_a_damaged_checkpoint_stops_init_from_before_any_data(pristine, tmp_path, monkeypatch):
    from zoo.training import sizing

    directory, outside = damaged_copy(pristine, "sharded", tmp_path)
    truncated(directory / SHARD, outside)
    monkeypatch.setattr(sizing, "build_data", lambda *a: pytest.fail("data built before the error"))
    with pytest.raises(ConfigError, match=rf"^init_from: 'hf:{directory}': {directory / SHARD}: not a valid "):
        init_from(directory, pristine["text"])


def test_links_that_stay_inside_load(pristine, tmp_path):
    """A link to a file inside the directory, and a snapshot in Hugging Face's cache (its files are links to
    ../../blobs/) load: only links that leave the directory (or the cache's repository folder) are refused."""
    want = from_pretrained(pristine["single"]).state_dict()
    directory, _ = damaged_copy(pristine, "single", tmp_path)
    (directory / "weights").mkdir()
    (directory / "model.safetensors").rename(directory / "weights" / "model.safetensors")
    (directory / "model.safetensors").symlink_to(Path("weights") / "model.safetensors")
    snapshot_dir = tmp_path / "hub" / "models--tiny--gpt2" / "snapshots" / "0123abc"
    blobs = tmp_path / "hub" / "models--tiny--gpt2" / "blobs"
    blobs.mkdir(parents=True)
    snapshot_dir.mkdir(parents=True)
    for i, f in enumerate(sorted(pristine["single"].iterdir())):
        shutil.copyfile(f, blobs / f"blob{i}")
        (snapshot_dir / f.name).symlink_to(Path("../../blobs") / f"blob{i}")
    for d in (directory, snapshot_dir):
        got = from_pretrained(d).state_dict()
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


def test_a_file_where_the_directory_belongs_is_one_line(pristine, tmp_path):
    file = pristine["single"] / "config.json"
    assert re.search(r"config\.json: not a directory \(hf:<dir> names a save_pretrained folder\)$",
                     refused(ENTRY_POINTS["api"][0], ConversionError, file, pristine["text"]))
    line = refused(ENTRY_POINTS["eval"][0], EvalError, file, pristine["text"])
    assert line.endswith("config.json: not a directory (hf:<dir> names a save_pretrained folder)"), line
    assert re.search(r"^init_from: 'hf:.*config\.json': not a directory \(a save_pretrained folder or a hub id\)$",
                     refused(init_from, ConfigError, file, pristine["text"]))


# ---- the real command lines: exit code 2 and one `error:` line, nothing outside touched

CLI = {  # name -> (command, layout, damage)
    "train-truncated-weights": ("train", "single", lambda d, o: truncated(d / "model.safetensors", o)),
    "train-shard-outside": ("train", "sharded", edit_index(shard_named(lambda o: f"../{o.name}/{SHARD}"))),
    "eval-pickle-only": ("eval", "single", pickle_only),
    "eval-config-link-out": ("eval", "single", lambda d, o: link_out(d / "config.json", o)),
    "eval-corrupt-tokenizer": ("eval", "single", lambda d, o: flip_header(d / "tokenizer.json", o)),
}


@pytest.mark.parametrize("name", CLI)
def test_the_command_lines_exit_2_with_one_line(pristine, tmp_path, name):
    command, layout, damage = CLI[name]
    directory, outside = damaged_copy(pristine, layout, tmp_path)
    damage(directory, outside)
    before = snapshot(outside)
    data = ["data=text_file", f"data.path={pristine['text']}", "data.context=32"]
    argv = ([str(ROOT / "train.py"), f"init_from=hf:{directory}", "debug=fast", f"hydra.run.dir={tmp_path / 'run'}",
             *data] if command == "train" else ["-m", "zoo.eval", f"hf:{directory}", *data])
    proc = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(directory) in errors[0], errors[0]
    assert snapshot(outside) == before
