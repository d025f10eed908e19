"""python -m zoo.kernels list | build [NAME ...]: the kernels, whether each is built here; build them ahead of a run."""

from __future__ import annotations

import sys

from zoo.commands import OneLineParser
from zoo.component import ConfigError
from zoo.hardware import cpu_kind
from zoo.kernels import KERNELS, build, check_policy


def _list() -> int:
    print(f"CPU kind {cpu_kind()}; C++ compiler: {build.compiler() or 'none (c++ or $CXX)'}; "
          f"build cache: {build.cache_dir()}")
    for name in KERNELS.names():
        kernel = KERNELS.get(name)
        here = "yes" if "cpu" in kernel.devices else f"no (runs on {', '.join(sorted(kernel.devices))})"
        built = "torch ops, nothing to build" if kernel.source is None else \
            f"{kernel.source}.cpp {'built' if build.is_built(kernel.source) else 'not built'}"
        instead = f" (auto: only where {kernel.fallback_for} is not applied)" if kernel.fallback_for else ""
        print(f"{name}: speeds up {kernel.target.__name__}; applies on this machine: {here}; {built}\n"
              f"    when: {kernel.when}{instead}")
    return 0


def _build(names: list[str]) -> int:
    names = check_policy(names) if names else KERNELS.names()
    failed = []
    for name in names:
        kernel = KERNELS.get(name)
        if kernel.source is None:
            print(f"{name}: torch ops, nothing to build")
        elif kernel.load():
            print(f"{name}: {kernel.source}.cpp built")
        else:
            failed.append(name)  # the reason is said by the build, on one line
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser("kernels", prog="python -m zoo.kernels", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="each kernel, what it speeds up, when it runs, whether it is built here")
    b = sub.add_parser("build", help="build the C++ kernels now (all, or the named ones), not in a run")
    b.add_argument("names", nargs="*", metavar="NAME", help="kernel names (default: all)")
    args = p.parse_args(argv)
    try:
        return _list() if args.command == "list" else _build(args.names)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
