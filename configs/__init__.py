"""Experiment configs: one `get_config()` per file, chosen with `run.py --config=<file>`."""
