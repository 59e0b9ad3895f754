"""The ringflow launcher: `python -m ringflow.launch` / `ringflow launch` start one host's
ranks with the worker environment contract (DESIGN.md section 3), watch them, and stop them
all on the first failure. Kept import-free so the watchdog starts fast.
"""
