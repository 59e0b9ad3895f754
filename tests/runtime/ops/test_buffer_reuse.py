"""The hot ops of a training step write into the previous step's arrays (no large
allocation per step) and still compute the same values as a fresh run."""

from __future__ import annotations

import numpy as np

import ringflow as rf


def _mlp():
    main, startup = rf.Program(), rf.Program()
    with rf.program_guard(main, startup):
        x = rf.data("x", [-1, 8])
        y = rf.data("y", [-1], dtype="int64")
        h = rf.nn.fc(rf.nn.fc(x, 16, activation="relu"), 16, activation="relu")
        loss = rf.nn.mean(rf.nn.softmax_with_cross_entropy(rf.nn.fc(h, 3), y))
        rf.append_backward(loss)
    return main, startup


def _feed(seed):
    r = np.random.default_rng(seed)
    return {"x": r.standard_normal((4, 8)).astype(np.float32), "y": r.integers(0, 3, 4)}


def test_second_step_reuses_arrays_of_the_first_and_matches_a_fresh_run():
    """The program's own ops, unfused (fused steps: tests/runtime/test_compiler_fuse.py)."""
    main, startup = _mlp()
    unfused = rf.CompiledProgram(main, rf.BuildStrategy(fuse_gemm_epilogue=False))
    block = main.global_block()
    hot = [n for op in block.ops
           if op.type in ("matmul_v2", "matmul_v2_grad", "elementwise_add", "relu", "relu_grad",
                          "softmax_with_cross_entropy", "softmax_with_cross_entropy_grad")
           for n in op.output_arg_names]
    fetch = [n for n in block.vars if n.endswith("@GRAD") and not n.startswith("fc")]
    fetch += [p.name + "@GRAD" for p in main.all_parameters()]

    exe, scope = rf.Executor(), rf.Scope()
    exe.run(startup, scope=scope)
    params = {p.name: scope[p.name].copy() for p in main.all_parameters()}
    exe.run(unfused, feed=_feed(1), scope=scope)
    first = {n: scope[n] for n in hot}
    second_values = exe.run(unfused, feed=_feed(2), fetch_list=fetch, scope=scope)
    assert all(scope[n] is first[n] for n in hot)

    fresh = rf.Scope()
    for name, value in params.items():
        fresh[name] = value
    expected = rf.Executor().run(unfused, feed=_feed(2), fetch_list=fetch, scope=fresh)
    for name, got, want in zip(fetch, second_values, expected):
        np.testing.assert_array_equal(got, want, err_msg=name)
