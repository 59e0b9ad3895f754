"""The spiral classification task the runtime's training tests learn: an MLP (2 -> 32 -> 32
-> 3, ReLU) on three interleaved spiral arms, full batch, in one process. (It was ``make
demo`` before TPTrainOperator; the demo is now the ringflow_tp_train DAG.)"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import ringflow as rf


def spiral(n_per_class: int = 100, classes: int = 3, noise: float = 0.2,
           seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Points on ``classes`` interleaved spiral arms (radius 0..1, with angular noise):
    x float32 [N, 2], y int64 [N]. Not linearly separable, so the hidden layers matter."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, n_per_class)
    xs, ys = [], []
    for k in range(classes):
        angle = 4.0 * t + 2.0 * np.pi * k / classes + noise * rng.standard_normal(n_per_class)
        xs.append(np.stack([t * np.cos(angle), t * np.sin(angle)], axis=1))
        ys.append(np.full(n_per_class, k, dtype=np.int64))
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys)


def build_mlp(hidden: tuple[int, ...] = (32, 32), classes: int = 3, lr: float = 0.01,
              seed: int = 0, optimizer: rf.optimizer.Optimizer | None = None):
    """Main and startup programs of the classifier; returns (main, startup, loss, logits)."""
    main, startup = rf.Program(), rf.Program()
    main.random_seed = startup.random_seed = seed
    with rf.program_guard(main, startup):
        x = rf.data("x", shape=[-1, 2], dtype="float32")
        y = rf.data("y", shape=[-1], dtype="int64")
        h = x
        for width in hidden:
            h = rf.nn.fc(h, width, activation="relu")
        logits = rf.nn.fc(h, classes)
        loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(logits, y))
        (optimizer or rf.optimizer.Adam(lr)).minimize(loss)
    return main, startup, loss, logits


def train(steps: int = 200, seed: int = 0, lr: float = 0.01,
          log: Callable[[int, float, float], None] | None = None
          ) -> tuple[list[tuple[float, float]], float]:
    """Full-batch training on ``spiral()``. Returns the (loss, accuracy) of every step, both
    measured on the batch the step trained on (before its update), and the accuracy of the
    final parameters (a ``clone(for_test=True)`` of the main program: forward only)."""
    x, y = spiral(seed=seed)
    main, startup, loss, logits = build_mlp(lr=lr, seed=seed)
    scope, exe = rf.Scope(), rf.Executor()
    exe.run(startup, scope=scope)
    history = []
    for step in range(1, steps + 1):
        loss_v, logits_v = exe.run(main, feed={"x": x, "y": y}, fetch_list=[loss, logits],
                                   scope=scope)
        history.append((float(loss_v.reshape(-1)[0]), accuracy(logits_v, y)))
        if log is not None:
            log(step, *history[-1])
    logits_v, = exe.run(main.clone(for_test=True), feed={"x": x, "y": y},
                        fetch_list=[logits], scope=scope)
    return history, accuracy(logits_v, y)


def accuracy(logits: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean(np.argmax(logits, axis=1) == labels))
