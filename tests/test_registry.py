import pytest

from zoo import registry
from zoo.registry import Registry, UnknownNameError


def test_register_get_names():
    r = Registry("thing")
    r.register("b", int)

    @r.register("a")
    def a():
        return 1

    assert r.names() == ["a", "b"]
    assert r.get("a") is a and "b" in r and "c" not in r


def test_duplicate_name_raises():
    r = Registry("thing")
    r.register("a", int)
    with pytest.raises(KeyError, match="already registered"):
        r.register("a", float)


def test_unknown_name_is_one_line_listing_valid_names():
    with pytest.raises(UnknownNameError) as e:
        registry.FFN.get("swishglu")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("ffn: unknown name 'swishglu'; valid: ")
    for name in ("relu", "gelu", "swiglu", "geglu", "reglu"):
        assert name in msg


def test_every_component_the_zoo_promises_is_registered():
    import zoo  # noqa: F401  (registers everything)

    assert {"mha", "mqa", "gqa"} <= set(registry.ATTENTION.names())
    assert {"learned", "sinusoidal", "rope", "alibi", "none"} <= set(registry.POSITION.names())
    assert {"layernorm", "rmsnorm"} <= set(registry.NORM.names())
    assert {"pre", "post"} <= set(registry.RESIDUAL.names())
    assert {"relu", "gelu", "swiglu", "geglu", "reglu"} <= set(registry.FFN.names())
    assert {"decoder_only", "encoder_only", "encoder_decoder"} <= set(registry.MODEL.names())
