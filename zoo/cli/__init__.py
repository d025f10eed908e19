"""The `zoo` command: every zoo tool as a subcommand, as `litgpt <command>` and `tune run` do.

    zoo train model=decoder_only norm=pre_ln      # python train.py's Hydra overrides and -m multiruns
    zoo sample <checkpoint> --prompt "ROMEO:"     # each tool's own arguments: zoo <command> --help

This module only picks the tool, whose own `main` reads the rest of the arguments, so `zoo --help` answers before
torch loads. The tools' shared helpers are in zoo.commands, the composed config in zoo.cli.common, `zoo train`
in zoo.cli.train.
"""

from __future__ import annotations

import difflib
import importlib
import sys

from zoo.commands import EXIT_ERROR, EXIT_OK, run_as

# command -> (the module whose main(argv) runs it, one line for `zoo --help`); each also runs as `python -m <module>`
COMMANDS = {
    "train": ("zoo.cli.train", "train a model from configs: Hydra overrides and -m sweeps, as python train.py"),
    "sample": ("zoo.sample", "generate text from a checkpoint"),
    "eval": ("zoo.eval", "perplexity and bits per byte of a checkpoint or hf:<model> on any data"),
    "inspect": ("zoo.inspect", "parameters, FLOPs and memory of a config (--vs another), attention maps"),
    "prepare": ("zoo.prepare", "tokenize a corpus once into token shards (data=tokens)"),
    "report": ("zoo.report", "compare a sweep's runs: a table per variant, curves, seed noise"),
    "bench": ("zoo.bench", "the benchmark: zoo against Hugging Face, x-transformers and nanoGPT"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    return "\n".join(["usage: zoo <command> [arguments]   (zoo <command> --help: that command's arguments)", "",
                      "A config-driven, registry-based Transformer zoo. Commands:",
                      *(f"  {name:<{width}}  {line}" for name, (_, line) in COMMANDS.items())])


def unknown(name: str) -> str:
    close = difflib.get_close_matches(name, COMMANDS, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown command '{name}'{hint}; valid: {', '.join(COMMANDS)}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        print(f"error: name a command; valid: {', '.join(COMMANDS)} (zoo --help says what each does)",
              file=sys.stderr)
        return EXIT_ERROR
    name, rest = argv[0], argv[1:]
    if name in ("-h", "--help", "help"):
        print(usage())
        return EXIT_OK
    if name not in COMMANDS:
        print(f"error: {unknown(name)}", file=sys.stderr)
        return EXIT_ERROR
    run_as(f"zoo {name}")
    return importlib.import_module(COMMANDS[name][0]).main(rest) or EXIT_OK
