"""Operators of the ringflow provider."""
