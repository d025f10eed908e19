"""Declared refusals (Part.refuses, Placement.refuses: zoo/component.py), from the registries: the covering design
of the combination and property tests (tests/helpers.py covering) leaves out every pair of parts one of them
declares it refuses, so here each such pair is built and must be refused, in one line naming both parts, before
anything is built. A pair that is refused without being declared fails the combination tests, which build it.
A part registered tomorrow with a `refuses` is under these tests with no edit here."""

import itertools

import pytest

from tests.helpers import FACTOR_KINDS, KINDS, case_id, cases, covering, lineages, model_cfg, part_of, refused
from zoo.build import resolve_config
from zoo.component import ConfigError, declared, refusal
from zoo.registry import REGISTRIES

FACTORS = {"name": lineages(), **{kind: cases(kind) for kind in KINDS}}
PAIRS = [((n, a), (m, b)) for n, m in itertools.combinations(FACTORS, 2)
         for a, b in itertools.product(FACTORS[n], FACTORS[m]) if refused((n, a), (m, b))]


def _row(lineage: str, *values: tuple[str, object]) -> dict:
    """A row of the covering design: the lineage, unless a value is one, and the values."""
    return {"name": lineage, **dict(values)}


def _declared() -> list[tuple[str, str, str, str]]:
    """Every (kind, name, other kind, key) a registered part declares it refuses."""
    return [(kind, name, other, key) for kind, registry in REGISTRIES.items() if kind != "optim"
            for name in registry.names() for other, keys in declared(registry.get(name), "refuses").items()
            for key in keys]


def test_some_pairs_are_declared_and_every_declaration_names_real_kinds_parts_or_options():
    """A declared key is a registered name of that kind, or one of its options: a typo would refuse nothing."""
    assert PAIRS, "no registered part declares a refusal (nGPT's placement does)"
    for kind, name, other, key in _declared():
        registry = REGISTRIES[other]
        options = {f for n in registry.names() for f in registry.options(n).__dataclass_fields__}
        assert key in registry.names() or key in options, f"{kind} '{name}' refuses {other} '{key}': no such part"


def test_every_declared_refusal_is_met_by_a_case():
    """Each declared key refuses at least one registered case, so the test below builds it."""
    hit = set()
    for pair in PAIRS:
        for x, y in (pair, pair[::-1]):
            (kind, name, _, entry), (other, them, opts, _) = part_of(*x), part_of(*y)
            found = refusal(entry, other, them, opts)
            if found:
                hit.add((kind, name, other, found[0]))
    assert set(_declared()) <= hit, set(_declared()) - hit


@pytest.mark.parametrize("lineage", lineages())
@pytest.mark.parametrize("a,b", PAIRS, ids=lambda p: f"{p[0]}={case_id(p[1]) if isinstance(p[1], dict) else p[1]}")
def test_every_declared_refused_pair_is_refused_in_one_line_naming_both(lineage, a, b):
    cfg = model_cfg(_row(lineage, a, b))
    with pytest.raises(ConfigError) as e:
        resolve_config(cfg)
    message = str(e.value)
    assert "\n" not in message and message.startswith("model.")
    assert f"'{part_of(*a)[1]}'" in message and f"'{part_of(*b)[1]}'" in message, message
    assert refused(a, b) in message  # the declared reason, as the build gives it


@pytest.mark.parametrize("lineage", lineages())
def test_a_refusing_part_builds_with_every_case_it_does_not_refuse(lineage):
    """The other side: beside a part that declares refusals, every case of the kinds it names that it does not
    refuse builds (on the meta device), so the declaration is all it refuses there."""
    for factor, values in FACTORS.items():
        for value in values:
            part = part_of(factor, value)
            refuses = declared(part[3], "refuses") if part else {}
            for other in (f for f in FACTORS if FACTOR_KINDS.get(f, f) in refuses and f != factor):
                for case in FACTORS[other]:
                    if not refused((factor, value), (other, case)):
                        resolve_config(model_cfg(_row(lineage, (factor, value), (other, case))))


def test_the_covering_design_has_every_allowed_pair_and_no_refused_one():
    """tests/helpers.py covering, as model_cases uses it: each pair of values of two kinds is in some row unless a
    part refuses it, and then in none."""
    factors = {k: FACTORS[k] for k in ("attention", "placement", "ffn")}
    rows = covering(factors)
    for n, m in itertools.combinations(factors, 2):
        for a, b in itertools.product(factors[n], factors[m]):
            present = any(row[n] == a and row[m] == b for row in rows)
            assert present != bool(refused((n, a), (m, b))), (n, a, m, b)
