"""One file per section; importing each registers it (zoo.bench.registry.SECTIONS). The order of these imports is
the order of the report and of a run, so they are kept out of import sorting."""

# isort: off
from zoo.bench.sections import (  # noqa: F401
    train,
    compile,
    generate,
    kv,
    norm,
    mfu,
    profile,
    memory,
    overhead,
    precision,
    ttt,
    choices,
    data,
    convert,
)
# isort: on
