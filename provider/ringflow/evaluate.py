"""``python -m ringflow.evaluate CHECKPOINT [--data PATH]`` (and ``ringflow evaluate``): a
checkpoint of any layout loaded in this one process (tensor-parallel shards put together),
its validation loss over the data printed as one JSON line: ``{"val_loss": ...,
"perplexity": ...}`` for a language model, ``{"val_loss": ..., "accuracy": ...}`` for a
classifier, with the checkpoint's folder, step and the number of samples.

Exit codes: 0 evaluated, 2 a bad argument, checkpoint or data (one line ``prog: error:
...`` on stderr)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any


def evaluate(checkpoint: str, data: str | None = None,
             batch_size: int | None = None) -> dict[str, Any]:
    """The metrics of the checkpoint at ``checkpoint`` (a step folder, or a checkpoint_dir:
    its newest) on ``data`` (default: the job's own validation data)."""
    from ringflow.errors import ConfigError
    from ringflow.executor import Executor
    from ringflow.train import restore
    from ringflow.train.data import open_data, open_eval_set
    from ringflow.train.evaluation import Evaluator

    restored = restore.load(checkpoint)
    spec, model = restored.spec, restored.model
    feeds = {n: restored.program.global_block().var(n) for n in model.feeds}
    vocab = model.config.get("vocab_size")
    tokenizer = restored.tokenizer or spec.tokenizer
    path = data or spec.eval_data
    if path is not None:
        evals, _ = open_eval_set(path, feeds, tokenizer, vocab)
    elif spec.validation_fraction:
        evals = open_data(spec, feeds, model.make_batch, vocab).eval
    else:
        raise ConfigError(f"checkpoint {restored.checkpoint.path}: its job had no "
                          f"validation data: give --data PATH")
    if "sample_loss" not in model.outputs:
        raise ConfigError(f"model {spec.model} names no per-sample loss "
                          f"(BuiltModel.outputs['sample_loss']): it cannot be evaluated")
    size = batch_size or spec.global_batch_size
    metrics = Evaluator(restored.program, model.outputs, evals, size,
                        slice(0, size)).run(Executor(), restored.scope)
    result: dict[str, Any] = {"val_loss": metrics["val_loss"]}
    if "val_accuracy" in metrics:
        result["accuracy"] = metrics["val_accuracy"]
    else:
        result["perplexity"] = math.exp(min(metrics["val_loss"], 700.0))
    result.update(checkpoint=restored.checkpoint.path, step=restored.checkpoint.step,
                  samples=evals.count)
    return result


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a checkpoint step folder, or a checkpoint_dir "
                                           "(its newest complete checkpoint)")
    parser.add_argument("--data", help="the data to evaluate on, of the kinds a job's data "
                                       "takes (default: the job's validation data)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="samples per forward pass (default: the job's global batch)")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m ringflow.evaluate") -> int:
    from ringflow.errors import ConfigError

    args = _parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    if args.batch_size is not None and args.batch_size < 1:
        print(f"{prog}: error: --batch-size must be >= 1, got {args.batch_size}",
              file=sys.stderr)
        return 2
    try:
        result = evaluate(args.checkpoint, args.data, args.batch_size)
    except ConfigError as exc:
        print(f"{prog}: error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return 2
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
