"""Launching a job on hosts: one `Launcher` interface, backends registered by name."""
