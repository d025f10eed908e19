"""Generate text from a trained checkpoint.

    python -m zoo.sample outputs/<date>/<time>/checkpoints/best.ckpt --prompt "ROMEO:" --max-new-tokens 300

Characters the tokenizer never saw are an error by default (one line naming them); with
`--unknown skip` they are dropped from the prompt instead. A model with learned positions
(at most max_seq_len of them) samples past that length with a sliding window: each character is
predicted from the last max_seq_len ones (said once on stderr).
"""

from __future__ import annotations

import sys

from zoo.cli.common import EXIT_ERROR, OneLineParser
from zoo.io import checkpoint_file_error, collect_once_at_exit
from zoo.schema import sampling_error


def main(argv: list[str] | None = None) -> int:
    collect_once_at_exit()
    p = OneLineParser("sample", description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", help="a run's checkpoints/best.ckpt or last.ckpt")
    p.add_argument("--prompt", default="\n", help="the text the samples continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens generated per sample (default 200)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="divides the logits: below 1 surer, above 1 more varied; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=None, help="draw only among the K likeliest tokens (default: all)")
    p.add_argument("--top-p", type=float, default=None,
                   help="draw only among the likeliest tokens whose probabilities sum to P (nucleus; default: all)")
    p.add_argument("--num-samples", type=int, default=1, help="how many samples, each from the same prompt")
    p.add_argument("--seed", type=int, default=0, help="the random draws' seed: the same seed, the same text")
    p.add_argument("--unknown", choices=["error", "skip"], default="error",
                   help="what to do with prompt characters the tokenizer never saw")
    args = p.parse_args(argv)
    flags = {k: f"--{k.replace('_', '-')}" for k in ("max_new_tokens", "temperature", "top_k", "top_p", "num_samples")}
    # Checked before the checkpoint is read and before torch loads: a bad flag or a missing file answers at once
    if error := sampling_error(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.num_samples,
                               flags) or checkpoint_file_error(args.checkpoint):
        print(f"error: {error}", file=sys.stderr)
        return EXIT_ERROR
    import torch

    from zoo.build import ConfigError
    from zoo.generate import generate
    from zoo.kernels import apply_kernels
    from zoo.training.checkpoint import CheckpointError, load_checkpoint

    try:
        model, tok, cfg = load_checkpoint(args.checkpoint)
        apply_kernels(model, cfg.get("kernels", "auto"))  # the run's kernel policy: its speed, its numerics
    except (CheckpointError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        ids = tok.encode(args.prompt, errors="strict" if args.unknown == "error" else "replace")
    except ValueError as e:  # prompt characters the tokenizer never saw
        print(f"error: {e} (or pass --unknown skip)", file=sys.stderr)
        return 2
    prompt = torch.tensor([ids or [tok.bos_id]] * args.num_samples)
    print_window_note(model, prompt.shape[1] + args.max_new_tokens)
    try:
        out = generate(model, prompt, args.max_new_tokens, args.temperature, args.top_k, args.top_p,
                       generator=torch.Generator().manual_seed(args.seed), slide=True)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for row in out.tolist():
        print(tok.decode(row, skip_special=True))
        print("-" * 40)
    return 0


def print_window_note(model, total: int) -> None:
    """Say once (on stderr, so the text on stdout stays clean) when sampling slides past the position limit."""
    from zoo.generate import position_limit

    limit = position_limit(model)
    if limit is not None and total > limit:
        print(f"note: learned positions end at max_seq_len={limit}; past that each token is predicted from the "
              f"last {limit} tokens (a sliding window)", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
