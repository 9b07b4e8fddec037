"""Speed and memory benchmarks (see benchmarks/README.md); run as `python -m benchmarks.<name>`
from the repository root."""
