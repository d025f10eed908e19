"""One training objective per lineage, each working on text and on seq2seq tasks.

- decoder_only -> CausalLM: next-token prediction; on tasks, `source <bos> target <eos>` with the
  loss on the target only.
- encoder_only -> MaskedLM: BERT's masked LM (15% of tokens; 80% <mask>, 10% random, 10% kept);
  on tasks, `source <bos> <mask>*len(target)` and the masks are filled in one pass.
- encoder_decoder -> Denoising: T5's span corruption on text; teacher-forced seq2seq on tasks.

Every objective can `predict` targets for task sources, so all three lineages report the same
metric on tasks: exact match of the whole target.
Batches are built from a torch.Generator, so batch i is the same in every run with the same seed.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zoo.data.tokenizers import BOS_ID, EOS_ID, MASK_ID, N_SPECIAL, PAD_ID, SENTINEL_IDS
from zoo.generate import generate
from zoo.registry import Registry

OBJECTIVE = Registry("objective")  # keyed by the lineage it trains
IGNORE = -100  # target id that the loss skips


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(), ignore_index=IGNORE)


class Objective:
    """Turns raw data into batches for one lineage and computes its loss."""

    # Each metric this objective's loss() returns (logged as val_<name>), with its direction: "min" when
    # lower is better, "max" when higher is. The report and the best-checkpoint tracking read these.
    metrics: dict[str, str] = {}

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def text_batch(self, windows: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
        """windows: (B, context + 1) token ids from a text."""
        raise NotImplementedError

    def task_batch(self, pairs: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        raise NotImplementedError

    def predict(self, model: nn.Module, src: torch.Tensor, target_len: int) -> list[list[int]]:
        """Greedy targets for same-length sources (B, S); target_len bounds their length."""
        raise NotImplementedError

    @torch.no_grad()  # type: ignore[untyped-decorator]  # torch is read untyped (pyproject.toml)
    def exact_match(self, model: nn.Module, pairs: list[tuple[list[int], list[int]]], batch_size: int = 256) -> float:
        """Fraction of pairs whose whole predicted target equals the reference."""
        # same source and target length: batches need no padding
        groups: defaultdict[tuple[int, int], list[tuple[list[int], list[int]]]] = defaultdict(list)
        for src, tgt in pairs:
            groups[len(src), len(tgt)].append((src, tgt))
        device = next(model.parameters()).device
        correct = 0
        for (_, tgt_len), group in groups.items():
            for i in range(0, len(group), batch_size):
                chunk = group[i:i + batch_size]
                src = torch.tensor([s for s, _ in chunk], device=device)
                preds = self.predict(model, src, tgt_len)
                correct += sum(p == t for p, (_, t) in zip(preds, chunk, strict=True))
        return correct / max(len(pairs), 1)


def _until_eos(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids


@OBJECTIVE.register("decoder_only")
class CausalLM(Objective):
    def text_batch(self, windows: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
        return {"input": windows[:, :-1], "target": windows[:, 1:]}

    def task_batch(self, pairs: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        inputs, targets = [], []
        for src, tgt in pairs:
            seq = src + [BOS_ID] + tgt + [EOS_ID]
            inputs.append(seq[:-1])
            targets.append([IGNORE] * len(src) + tgt + [EOS_ID])  # loss on the target only
        return {"input": _pad(inputs, PAD_ID), "target": _pad(targets, IGNORE)}

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return cross_entropy(model(batch["input"]), batch["target"]), {}

    def predict(self, model: nn.Module, src: torch.Tensor, target_len: int) -> list[list[int]]:
        prompt = torch.cat([src, torch.full_like(src[:, :1], BOS_ID)], dim=1)
        out = generate(model, prompt, target_len + 1, eos_id=EOS_ID)
        return [_until_eos(row) for row in out[:, prompt.shape[1]:].tolist()]


@OBJECTIVE.register("encoder_only")
class MaskedLM(Objective):
    rate = 0.15  # fraction of tokens to predict (Devlin et al. 2019)
    metrics = {"masked_acc": "max"}

    def text_batch(self, windows: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
        tokens = windows[:, :-1].clone()
        chosen = torch.rand(tokens.shape, generator=g) < self.rate
        target = torch.where(chosen, tokens, IGNORE)
        roll = torch.rand(tokens.shape, generator=g)
        random_ids = torch.randint(N_SPECIAL, self.vocab_size, tokens.shape, generator=g)
        tokens[chosen & (roll < 0.8)] = MASK_ID  # 80% <mask>
        swap = chosen & (roll >= 0.8) & (roll < 0.9)  # 10% a random token, 10% unchanged
        tokens[swap] = random_ids[swap]
        return {"input": tokens, "target": target}

    def task_batch(self, pairs: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        inputs = [src + [BOS_ID] + [MASK_ID] * len(tgt) for src, tgt in pairs]
        targets = [[IGNORE] * (len(src) + 1) + tgt for src, tgt in pairs]
        padding = _pad([[1] * len(r) for r in inputs], 0).bool()
        return {"input": _pad(inputs, PAD_ID), "target": _pad(targets, IGNORE), "padding": padding}

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        logits = model(batch["input"], batch.get("padding"))
        target = batch["target"]
        chosen = target != IGNORE
        accuracy = (logits.argmax(-1)[chosen] == target[chosen]).float().mean()
        return cross_entropy(logits, target), {"masked_acc": accuracy}

    def predict(self, model: nn.Module, src: torch.Tensor, target_len: int) -> list[list[int]]:
        masks = torch.full((src.shape[0], target_len), MASK_ID, device=src.device)
        tokens = torch.cat([src, torch.full_like(src[:, :1], BOS_ID), masks], dim=1)
        ids: list[list[int]] = model(tokens)[:, -target_len:].argmax(-1).tolist()  # (B, target_len) token ids
        return ids


@OBJECTIVE.register("encoder_decoder")
class Denoising(Objective):
    noise_density, mean_span = 0.15, 3.0  # T5's span corruption (Raffel et al. 2020)

    def text_batch(self, windows: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
        tokens = windows[:, :-1]
        t = tokens.shape[1]
        n_noise = max(1, round(t * self.noise_density))
        n_spans = max(1, min(len(SENTINEL_IDS), round(n_noise / self.mean_span), t - n_noise))
        srcs, tgts = [], []
        for row in tokens.tolist():
            noise = _random_split(n_noise, n_spans, g)
            keep = _random_split(t - n_noise, n_spans, g)
            src, tgt, i = [], [], 0
            for k, (n_keep, n_drop) in enumerate(zip(keep, noise, strict=True)):
                src += row[i:i + n_keep] + [SENTINEL_IDS[k]]
                tgt += [SENTINEL_IDS[k]] + row[i + n_keep:i + n_keep + n_drop]
                i += n_keep + n_drop
            srcs.append(src)
            tgts.append(tgt + [EOS_ID])
        # same lengths in every row: no padding; through numpy, several times faster than torch.tensor(lists)
        src, tgt = torch.from_numpy(np.array(srcs, dtype=np.int64)), torch.from_numpy(np.array(tgts, dtype=np.int64))
        return {"src": src, "input": torch.cat([torch.full_like(tgt[:, :1], BOS_ID), tgt[:, :-1]], 1),
                "target": tgt}

    def task_batch(self, pairs: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        srcs = [src for src, _ in pairs]
        return {"src": _pad(srcs, PAD_ID), "src_padding": _pad([[1] * len(s) for s in srcs], 0).bool(),
                "input": _pad([[BOS_ID] + tgt for _, tgt in pairs], PAD_ID),
                "target": _pad([tgt + [EOS_ID] for _, tgt in pairs], IGNORE)}

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return cross_entropy(model(batch["src"], batch["input"], batch.get("src_padding")), batch["target"]), {}

    def predict(self, model: nn.Module, src: torch.Tensor, target_len: int) -> list[list[int]]:
        prompt = torch.full_like(src[:, :1], BOS_ID)
        out = generate(model, prompt, target_len + 1, src=src, eos_id=EOS_ID)
        return [_until_eos(row) for row in out[:, 1:].tolist()]


# Metrics every objective reports: the loss (val_loss, and val_loss_long beyond the training context),
# perplexity and bits per character derived from it, and exact match on tasks (zoo.training.module, runner).
COMMON_METRICS = {"val_loss": "min", "val_loss_long": "min", "val_ppl": "min", "val_bpc": "min",
                  "exact_match": "max", "exact_match_long": "max"}


def metric_directions() -> dict[str, str]:
    """Every validation metric of every objective -> "min" or "max"."""
    out = dict(COMMON_METRICS)
    for name in OBJECTIVE.names():
        out.update({f"val_{k}": d for k, d in OBJECTIVE.get(name).metrics.items()})
    return out


def higher_is_better(metric: str) -> bool:
    """The declared direction of a validation metric; ValueError for one no objective declares."""
    directions = metric_directions()
    if metric not in directions:
        raise ValueError(f"metric '{metric}' has no declared direction; valid: {', '.join(sorted(directions))}")
    return directions[metric] == "max"


def _random_split(total: int, parts: int, g: torch.Generator) -> list[int]:
    """`total` split into `parts` positive integers, uniformly at random."""
    cuts = (torch.randperm(total - 1, generator=g)[: parts - 1] + 1).sort().values.tolist()
    bounds = [0] + cuts + [total]
    return [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
