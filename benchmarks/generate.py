"""Generation benchmark: ``ringflow.generate``'s key/value-cached decoder vs recomputing the
whole context for every new token (``--no-cache``), 256 new tokens from a 16-token prompt.

Models (the built-in transformer, byte vocabulary 256, float32 weights as a job writes them,
decoded in float64): ``small`` = hidden 128, 4 heads, 4 layers, seq_len 512 (the 272 tokens
fit the window); ``window`` = the same with seq_len 128, so the window restarts (the cache
is filled again from the newest 64 tokens) as generation passes it. Each (model, decoder)
runs ``--rounds`` times in a shuffled order, one process, OPENBLAS/OMP threads 1; the
table shows the median seconds, tokens per second and the speed-up of the cache, and
checks that both decoders gave the same tokens.

    flock -x /work/quiet.lock python benchmarks/generate.py [--rounds 5] [--out FILE.jsonl]
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import ringflow as rf  # noqa: E402
from ringflow.models import decode, transformer  # noqa: E402

MODELS = {"small": 512, "window": 128}   # name -> seq_len
SIZES = dict(vocab_size=256, hidden_size=128, num_heads=4, num_layers=4)
NEW_TOKENS, PROMPT = 256, list(b"def train(spec):")


def weights(seq_len: int) -> tuple[dict[str, np.ndarray], dict]:
    """A freshly initialised model's parameters (the startup program's draw), seed 0."""
    main, startup = rf.Program(), rf.Program()
    main.random_seed = startup.random_seed = 0
    with rf.program_guard(main, startup):
        model = transformer(seq_len=seq_len, **SIZES)
    scope = rf.Scope()
    rf.Executor().run(startup, scope=scope)
    return ({p.name: np.array(scope[p.name]) for p in main.global_block().iter_parameters()},
            model.config)


def run_once(decoder: decode.Decoder, cached: bool) -> tuple[float, list[int]]:
    start = time.perf_counter()
    tokens = decode.generate(decoder, PROMPT, NEW_TOKENS, temperature=1.0, top_k=40,
                             seed=1, cached=cached)
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None, help="append each run as a JSON line")
    args = parser.parse_args()
    decoders = {name: decode.Decoder(*weights(seq_len)) for name, seq_len in MODELS.items()}
    plan = [(m, c) for m in MODELS for c in (True, False)] * args.rounds
    random.Random(0).shuffle(plan)
    times: dict[tuple[str, bool], list[float]] = {k: [] for k in set(plan)}
    tokens: dict[tuple[str, bool], list[int]] = {}
    out = open(args.out, "a") if args.out else None   # noqa: SIM115
    for model, cached in plan:
        load = os.getloadavg()[0]
        seconds, got = run_once(decoders[model], cached)
        times[model, cached].append(seconds)
        assert tokens.setdefault((model, cached), got) == got
        if out:
            out.write(json.dumps({"model": model, "cached": cached, "seconds": seconds,
                                  "new_tokens": NEW_TOKENS, "loadavg": load}) + "\n")
    if out:
        out.close()
    print("| model | seq_len | uncached s | cached s | cached tokens/s | speed-up | same "
          "tokens |\n|---|---|---|---|---|---|---|")
    for model, seq_len in MODELS.items():
        slow = statistics.median(times[model, False])
        fast = statistics.median(times[model, True])
        same = tokens[model, True] == tokens[model, False]
        print(f"| {model} | {seq_len} | {slow:.3f} | {fast:.3f} | {NEW_TOKENS / fast:,.0f} | "
              f"{slow / fast:.1f}x | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
