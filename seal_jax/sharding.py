"""Device mesh, partition rules of the parameters, and activation layouts.

Mesh axes: `data` and `fsdp` split the batch; `fsdp` also splits the model dimension of every
weight (ZeRO-3 style); `tensor` splits heads, the MLP width and the vocabulary (Megatron style).
Every parameter kind has a rule; a parameter without one is an error, so a new architecture
cannot silently end up replicated.

Activations carry their layout too (`constrain`, with the logical axes of ACTIVATION_AXES): the
batch stays split over (data, fsdp) through every layer. Without that XLA follows the weights'
layout, splits activations on the model dimension and gathers them over the whole global batch;
with it, each layer's weights are gathered just in time instead, so per-chip activation memory
does not grow with the chip count (FSDP). The loss is vocabulary-parallel: the output matrix is
split on the vocabulary over every chip and each chunk of hidden states is gathered instead, so
no chip holds the whole [E, V] matrix or its float32 gradient.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import logging
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")
# Logical activation axes -> mesh axes; a logical axis not listed (or None) is not split.
# "vocab" splits the output vocabulary over every chip for the loss (`chunked_token_logprobs`).
ACTIVATION_AXES = {"batch": BATCH_AXES, "heads": "tensor", "mlp": "tensor", "vocab": MESH_AXES}

# (regex on the "/"-joined parameter path, spec of the parameter's own (unstacked) dims).
PARAM_RULES: tuple[tuple[str, tuple[Any, ...]], ...] = (
    (r"embed_tokens/embedding$", ("tensor", "fsdp")),
    (r"^lm_head$", ("fsdp", "tensor")),
    (r"(q_proj|k_proj|v_proj|gate_proj|up_proj)/kernel$", ("fsdp", "tensor")),
    (r"(q_proj|k_proj|v_proj)/bias$", ("tensor",)),
    (r"(o_proj|down_proj)/kernel$", ("tensor", "fsdp")),
    (r"(norm|layernorm)/scale$", (None,)),
    # Qwen3.5's linear-attention layers: FSDP only. Their projections feed a convolution over
    # [q | k | v] and per-head gates that would split unevenly over heads (transformers' own
    # tensor-parallel plan gathers these outputs too); they are a small share of the weights.
    (r"(in_proj_qkv|in_proj_z|in_proj_a|in_proj_b)/kernel$", ("fsdp", None)),
    (r"out_proj/kernel$", (None, "fsdp")),
    (r"conv1d/weight$", (None, None, None)),
    (r"linear_attn/(A_log|dt_bias)$", (None,)),
)


def make_mesh(
    data: int = -1, fsdp: int = 1, tensor: int = 1, devices: Sequence[Any] | None = None
) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all). One size may be -1 (the rest)."""
    devices = list(devices if devices is not None else jax.devices())
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, sizes))}: use positive sizes, one -1")
    known = int(np.prod([s for s in sizes if s != -1]))
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices cannot be split into a mesh with {sizes}")
        sizes[sizes.index(-1)] = len(devices) // known
    if int(np.prod(sizes)) != len(devices):
        raise ValueError(
            f"mesh {dict(zip(MESH_AXES, sizes))} needs {int(np.prod(sizes))} devices, "
            f"{len(devices)} available"
        )
    return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def mesh_from_config(mesh_cfg: Any) -> Mesh:
    """The mesh described by a config section with fields data, fsdp, tensor."""
    return make_mesh(mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor)


def single_device_mesh() -> Mesh:
    """A 1x1x1 mesh on the first device (the default when no mesh is given)."""
    return make_mesh(1, 1, 1, devices=jax.devices()[:1])


def _fit(spec: tuple[Any, ...], shape: tuple[int, ...], mesh: Mesh, name: str) -> P:
    """Drops mesh axes from dims they do not divide (logged), so any model size shards legally."""
    fitted = []
    for dim, axis in zip(shape, spec):
        if axis is not None and dim % mesh.shape[axis]:
            logging.warning(
                "%s: dim %d not divisible by %s=%d; replicated", name, dim, axis, mesh.shape[axis]
            )
            axis = None
        fitted.append(axis)
    return P(*fitted)


def param_spec(path: str, shape: tuple[int, ...], mesh: Mesh) -> P:
    """PartitionSpec of one parameter from its path ('layers/...' params carry a layer axis)."""
    stacked = path.startswith("layers/")
    own_shape = shape[1:] if stacked else shape
    for pattern, spec in PARAM_RULES:
        if re.search(pattern, path):
            if len(spec) != len(own_shape):
                raise ValueError(f"parameter {path} has shape {shape}; rule expects {spec}")
            fitted = _fit(spec, own_shape, mesh, path)
            return P(None, *fitted) if stacked else fitted
    raise ValueError(f"no partition rule for parameter {path!r} (shape {shape})")


def path_str(path: tuple[Any, ...]) -> str:
    """'a/b/c' from a jax tree path of dict keys."""
    return "/".join(str(getattr(k, "key", k)) for k in path)


def param_shardings(params_shape: Any, mesh: Mesh) -> Any:
    """A pytree of NamedSharding matching `params_shape` (arrays or ShapeDtypeStructs)."""
    return jax.tree_util.tree_map_with_path(
        lambda p, x: NamedSharding(mesh, param_spec(path_str(p), x.shape, mesh)), params_shape
    )


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a batch array: leading dim over (data, fsdp), the rest replicated."""
    return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    """Fully replicated sharding (scalars, small tables)."""
    return NamedSharding(mesh, P())


def logical_spec(shape: tuple[int, ...], *logical: str | None) -> P:
    """The PartitionSpec of an array of `shape` laid out by its logical axes (ACTIVATION_AXES)
    on the mesh being traced under. Mesh axes that do not divide their dimension are left out,
    so any shape stays legal."""
    mesh = jax.sharding.get_abstract_mesh()
    spec = []
    for dim, name in zip(shape, logical):
        axes = ACTIVATION_AXES.get(name) if name else None
        axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = int(np.prod([mesh.shape[a] for a in axes])) if axes else 1
        spec.append(axes if axes and size > 1 and dim % size == 0 else None)
    return P(*spec)


def on_mesh() -> bool:
    """Whether code is being traced under a mesh of more than one device (`jax.set_mesh`)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and mesh.size > 1


def constrain(x: jax.Array, *logical: str | None) -> jax.Array:
    """x laid out by its logical axes (`logical_spec`) on the mesh being traced under; a no-op
    outside a mesh context and on one device."""
    if not on_mesh():
        return x
    return jax.lax.with_sharding_constraint(x, logical_spec(x.shape, *logical))
