"""The persistent compilation cache run.py turns on: a program compiled by one process is loaded,
not compiled, by the next; JAX's own setting wins; an empty path turns it off."""

import os
import subprocess
import sys

from tests.devices import REPO

# Compiles one program that takes well over the cache's 0.1 s threshold (~0.6 s on 2 cores),
# then prints the cache directory JAX uses and how many programs it loaded from it.
SCRIPT = """
import sys
import jax, jax.numpy as jnp
from seal_jax import modes

hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name == "/jax/compilation_cache/cache_hits" else None
)
modes.use_compilation_cache(sys.argv[1])

@jax.jit
def f(x):
    for i in range(60):
        x = jnp.tanh(x @ x + i)
    return x

f(jnp.ones((8, 8))).block_until_ready()
print(jax.config.jax_compilation_cache_dir, len(hits))
"""


def _run(path, **env):
    full = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    full.update(env, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, path],
        cwd=REPO,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.split()
    return out[0], int(out[1])


def test_second_process_loads_the_program_instead_of_compiling(tmp_path):
    cache = tmp_path / "xla"
    assert _run(str(cache)) == (str(cache), 0)
    assert os.listdir(cache)
    assert _run(str(cache)) == (str(cache), 1)


def test_home_is_expanded(tmp_path):
    assert _run("~/xla", HOME=str(tmp_path)) == (str(tmp_path / "xla"), 0)
    assert os.listdir(tmp_path / "xla")


def test_jax_environment_setting_wins_and_empty_path_turns_it_off(tmp_path):
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    assert _run(str(ours), JAX_COMPILATION_CACHE_DIR=str(theirs)) == (str(theirs), 0)
    assert not ours.exists()
    assert _run("") == ("None", 0)
