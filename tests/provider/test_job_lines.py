"""The provider reads a launcher's machine lines (rank 0's `[train] metric|summary`, an
agent's `[launch] result`) only from whole lines whose unmarked prefix stands at their very
start: what the ranks print after a `\\r`, behind another prefix, in a piece the launcher
marked `+`, or in a last line without its newline, is shown but never read."""

from __future__ import annotations

from types import SimpleNamespace

from ringflow_provider.launchers.lines import RESULT, SUMMARY, lines_of

SUMMARY_LINE = '[rank 0] [train] summary {"final_loss": 0.5, "steps": 2}'
RESULT_LINE = '[launch] result {"exit_code": 0, "cause": "ok"}'


def read(data: bytes, gathered: bool = False) -> list[tuple[str | None, str]]:
    handle = SimpleNamespace(show_hosts=True, gathered=gathered, hosts=["h0", "h1"])
    return [(line.kind, line.shown) for line in lines_of(data, handle, "h0")]


def test_whole_lines_with_the_prefix_at_their_start_are_read():
    assert read(f"{SUMMARY_LINE}\n{RESULT_LINE}\n".encode()) == [
        (SUMMARY, '[h0/rank 0] [train] summary {"final_loss": 0.5, "steps": 2}'),
        (RESULT, '[h0/launch] result {"exit_code": 0, "cause": "ok"}')]


def test_a_line_after_a_carriage_return_a_marked_piece_or_without_newline_is_not():
    data = (f"[rank 1] x\r{SUMMARY_LINE}\n[rank 1] y\r{RESULT_LINE}\n"
            f"[rank 0]+ [train] summary {{}}\n{SUMMARY_LINE}").encode()
    assert [kind for kind, _ in read(data)] == [None] * 6
    assert read(data)[4] == (None, "[h0/rank 0]+ [train] summary {}")


def test_under_mpirun_a_tag_marked_as_no_whole_line_is_not_read():
    data = (f"[1,1]<stdout>:{SUMMARY_LINE}\n[1,1]<stdout>+:{RESULT_LINE}\n"
            f"[1,0]<stdout>+:{SUMMARY_LINE}\n").encode()
    assert read(data, gathered=True) == [
        (SUMMARY, '[h1/rank 0] [train] summary {"final_loss": 0.5, "steps": 2}'),
        (None, '[h1/launch]+ result {"exit_code": 0, "cause": "ok"}'),
        (None, '[h0/rank 0]+ [train] summary {"final_loss": 0.5, "steps": 2}')]
