"""``python -m ringflow.generate CHECKPOINT --prompt TEXT [--max-new-tokens N]
[--temperature T] [--top-k K] [--seed S]`` (and ``ringflow generate``): text sampled from a
transformer checkpoint of any layout, in this one process, with a key/value cache (no
recomputation of the prefix per token; ``--no-cache`` recomputes, for comparison). Prints
the prompt and the generated text, or with ``--json`` one JSON line ``{"prompt", "text",
"tokens", "tokenizer", "checkpoint", "step"}`` (a model trained on token ids, an ``.npy``
stream or synthetic data, takes and gives ids separated by spaces). The same seed gives
the same text.

Exit codes: 0 generated, 2 a bad argument or checkpoint (one line ``prog: error: ...``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def generate(checkpoint: str, prompt: str, max_new_tokens: int = 200,
             temperature: float = 1.0, top_k: int | None = None, seed: int = 0,
             cached: bool = True) -> dict[str, Any]:
    from ringflow.errors import ConfigError
    from ringflow.models import decode
    from ringflow.train import restore
    from ringflow.train.text import Tokenizer

    restored = restore.load(checkpoint)
    spec = restored.spec
    if spec.model != "transformer":
        raise ConfigError(f"checkpoint {restored.checkpoint.path} is a {spec.model} model; "
                          f"generate samples from a transformer")
    tokenizer = restored.tokenizer or Tokenizer("ids")
    ids = tokenizer.encode(prompt)
    if not len(ids):
        raise ConfigError("the prompt is empty: give at least one character")
    decoder = decode.Decoder(restored.params, restored.model.config,
                             spec.model_args.get("name", "gpt"))
    tokens = decode.generate(decoder, ids, max_new_tokens, temperature, top_k, seed, cached,
                             tokenizer.vocab_size)
    return {"prompt": prompt, "text": tokenizer.decode(tokens), "tokens": tokens,
            "tokenizer": tokenizer.kind, "checkpoint": restored.checkpoint.path,
            "step": restored.checkpoint.step}


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a checkpoint step folder, or a checkpoint_dir "
                                           "(its newest complete checkpoint)")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="0: always the most likely token")
    parser.add_argument("--top-k", type=int, default=None,
                        help="sample among the K most likely tokens only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-cache", action="store_true",
                        help="recompute the whole context for every token")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m ringflow.generate") -> int:
    from ringflow.errors import ConfigError

    args = _parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    bad = [f"--{n} must be >= {m}, got {v}" for n, v, m in (
        ("max-new-tokens", args.max_new_tokens, 0), ("temperature", args.temperature, 0),
        ("top-k", 1 if args.top_k is None else args.top_k, 1), ("seed", args.seed, 0))
        if v < m]
    if bad:
        print(f"{prog}: error: {bad[0]}", file=sys.stderr)
        return 2
    try:
        result = generate(args.checkpoint, args.prompt, args.max_new_tokens,
                          args.temperature, args.top_k, args.seed, not args.no_cache)
    except ConfigError as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return 2
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        between = " " if result["tokenizer"] == "ids" else ""   # ids are words
        print(result["prompt"] + between + result["text"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
