"""A tiny float32 setting for tests: small random checkpoints built by the tests themselves."""

import ml_collections

from configs.base import base_config


def get_config() -> ml_collections.ConfigDict:
    """float32 everywhere (exact comparisons), no remat, all devices on the data axis."""
    c = base_config()
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat = False
    c.model.logprob_chunk = 16
    c.rl.group_size = 2
    c.optim.lr = 1e-3
    return c
