"""The implementations zoo is timed against, one file each: a builder takes a shape and a family (GPT-2 style or
Llama style) and returns the model and its loss function, computed the same way for all (base.lm_loss)."""

from zoo.bench.contenders import hf, nanogpt, xt
from zoo.bench.contenders import zoo as zoo_contender
from zoo.bench.contenders.base import NotInstalled, lm_loss, require
from zoo.bench.contenders.zoo import zoo_config, zoo_model
from zoo.bench.settings import PEERS

BUILDERS = {"zoo": zoo_contender.build_zoo, "hf": hf.build_hf, "xt": xt.build_xt, "nanogpt": nanogpt.build_nanogpt}
LABELS = {"zoo": "zoo", "hf": "HF transformers", "xt": "x-transformers", "nanogpt": "nanoGPT"}
FAMILY_LABELS = {"gpt2": "GPT-2 style", "llama": "Llama style"}
assert tuple(BUILDERS) == PEERS, "a contender is one file here, one builder and one name in settings.PEERS"

__all__ = ["BUILDERS", "FAMILY_LABELS", "LABELS", "PEERS", "NotInstalled", "lm_loss", "require", "zoo_config",
           "zoo_model"]
