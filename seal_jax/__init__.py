"""seal_jax: SEAL (co-evolving a tool-use policy and its learning environment) in JAX."""
