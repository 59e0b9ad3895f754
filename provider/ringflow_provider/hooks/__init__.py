"""Hooks of the ringflow provider: SSH to the several hosts of one job."""
