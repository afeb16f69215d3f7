"""Coral's integer programs and their fast exact companions: pure functions, no I/O, no async."""
