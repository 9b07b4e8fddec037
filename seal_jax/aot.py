"""Ahead-of-time compilation of a run's device programs, with no weights and no data.

Every program is lowered from `jax.ShapeDtypeStruct`s that carry the run's shardings and compiled
for the mesh's devices: the local ones, or the abstract devices of a TPU topology
(`jax.experimental.topologies`, which needs libtpu but no chip). The compiled program's
`memory_analysis()` gives per-device argument and temporary bytes; its optimized HLO shows the
collectives. A TPU program that cannot fit fails to compile; its overflow is read from the
compiler's message. `check` is `run.py --mode=compile`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
from etils import epath
from jax.sharding import Mesh

from seal_jax import config as config_lib
from seal_jax import episodes, estimate, optim, sharding, train_step, weight_sync
from seal_jax import update as update_lib
from seal_jax.models import LoadedModel, Qwen35Config, QwenConfig
from seal_jax.models.checkpoint import param_shapes

# Batch arrays of one update micro-step (the layout of seal_jax.rl), without a shared prompt.
_UPDATE_BATCH = {
    "input_ids": jnp.int32,
    "positions": jnp.int32,
    "mask": jnp.bool_,
    "targets": jnp.int32,
    "loss_mask": jnp.bool_,
    "old_logprobs": jnp.float32,
    "ref_logprobs": jnp.float32,
}
GIB = 2**30


class DoesNotFit(config_lib.ConfigError):
    """A program of the run needs more memory per chip than the chip has."""


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
    """Bytes per device of one compiled program: its arguments, outputs not aliased to an
    argument, temporaries, and the resident state alive beside it that it does not take as an
    argument. `error` is the compiler's message when the program does not fit at all."""

    name: str
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    other_resident_bytes: int = 0
    error: str = ""

    @property
    def peak_bytes(self) -> int:
        """Everything alive on a device while the program runs, at most."""
        fixed = self.argument_bytes + self.output_bytes + self.other_resident_bytes
        return fixed + self.temp_bytes


def abstract_model(
    cfg: QwenConfig | Qwen35Config, mesh: Mesh, param_dtype: Any, compute_dtype: Any
) -> LoadedModel:
    """A LoadedModel whose params are ShapeDtypeStructs with the training shardings."""
    shapes = param_shapes(cfg, param_dtype)
    shards = sharding.param_shardings(shapes, mesh)
    return LoadedModel(cfg, _with_shardings(shapes, shards), mesh, "", compute_dtype)


def _with_shardings(shapes: Any, shardings: Any) -> Any:
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings
    )


def abstract_opt_state(updater: update_lib.Updater, params: Any) -> Any:
    """The optimizer state of params as ShapeDtypeStructs with its shardings."""
    shards = optim.opt_state_shardings(
        updater.optimizer, params, jax.tree.map(lambda x: x.sharding, params)
    )
    return _with_shardings(jax.eval_shape(updater.optimizer.init, params), shards)


def lower_update(
    updater: update_lib.Updater, model: LoadedModel, length: int
) -> dict[str, tuple[Any, tuple]]:
    """The update micro-step at its largest shape (rows of `length` tokens, whole sequences),
    and the optimizer step where it is a program of its own (`optim.moments_on_host`), lowered
    for the model's mesh; name -> (lowered, its arguments)."""
    config = updater.config
    state = abstract_opt_state(updater, model.params)
    rows = update_lib.micro_batch_rows(config)
    batch = _batch(model.mesh, rows, length, config.rl.kl_coef > 0)
    args = (model.params, state, batch)
    step = updater.step_fn
    with jax.set_mesh(model.mesh):
        if not isinstance(step, train_step.AccumulatingStep):
            return {"update_micro_step": (step.lower(*args), args)}
        return {
            "update_micro_step": (step.micro_step.lower(*args), args),
            "update_optimizer_step": (step.optimizer_step.lower(*args[:2]), args[:2]),
        }


def lower_logprobs(
    updater: update_lib.Updater, model: LoadedModel, length: int
) -> tuple[Any, tuple]:
    """The old / reference log-prob pass over one micro-batch of rows; returns (lowered,
    arguments)."""
    rows = update_lib.micro_batch_rows(updater.config)
    batch = _batch(model.mesh, rows, length, with_ref=False)
    keys = ("input_ids", "positions", "mask", "targets")
    args = (model.params, {k: batch[k] for k in keys})
    with jax.set_mesh(model.mesh):
        return updater.logprob_fn.lower(*args), args


def lower_rollout(config: Any, model: LoadedModel, engine: Any) -> dict[str, tuple[Any, tuple]]:
    """The rollout's prefill and decode programs at the largest bucket a step can use (every row
    of one rollout chunk, a cache of the whole context), and the sampling copy when the engine
    has a sampling layout (`seal_jax.weight_sync`); name -> (lowered, arguments)."""
    from seal_jax.rollout import params_layout

    rows = engine.batch_bucket(episodes.chunk_rows(config))
    cache = engine.abstract_cache(rows, engine.cache_len(config.rollout.context_limit))
    per_row = {
        "logits": jax.ShapeDtypeStruct((rows, model.config.vocab_size), jnp.float32),
        "keys": jax.eval_shape(lambda: jax.random.split(jax.random.key(0), rows)),
        "budget": jax.ShapeDtypeStruct((rows,), jnp.int32),
        "stop_ids": jax.ShapeDtypeStruct((rows, 4), jnp.int32),
        "ids": jax.ShapeDtypeStruct((rows, engine.config.prefill_chunk), jnp.int32),
        "lengths": jax.ShapeDtypeStruct((rows,), jnp.int32),
    }
    a = {k: engine.abstract_rows(v.shape, v.dtype) for k, v in per_row.items()}
    params, lowered = model.params, {}
    if engine.layout is not None:
        layout = engine.layout
        staged = _with_shardings(params, layout.staged(params))
        with jax.set_mesh(layout.global_mesh):
            copy = layout.copy_program(staged).lower(staged)
        lowered["sampling_copy"] = (copy, (staged,))
        params = _with_shardings(
            jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, layout.dtype), params),
            layout.shardings(params, layout.mesh),
        )
    variant = params_layout(params)
    prefill = (params, cache, a["logits"], a["ids"], a["lengths"])
    floor = jax.ShapeDtypeStruct((), jnp.int32)
    decode = (params, cache, a["logits"], a["keys"], a["budget"], a["stop_ids"], floor)
    with jax.set_mesh(engine.mesh):
        lowered["rollout_prefill"] = (engine.program("prefill", variant).lower(*prefill), prefill)
        lowered["rollout_decode"] = (engine.program("decode", variant).lower(*decode), decode)
        if config.rollout.slots:
            lowered.update(_lower_slot_programs(engine, variant, params, cache, a["logits"]))
    return lowered


def _lower_slot_programs(
    engine: Any, variant: Any, params: Any, cache: Any, logits: Any
) -> dict[str, tuple[Any, tuple]]:
    """Continuous batching's programs on some rows of the slots' cache (`seal_jax.continuous`):
    a prefill and a decode of half the slots (at most that many per call) and a row copy."""
    slots = cache["mask"].shape[0]
    rows = engine.batch_bucket(max(slots // 2, engine.batch_shards))
    index = jax.ShapeDtypeStruct((rows,), jnp.int32)
    ids = engine.abstract_rows((rows, engine.config.prefill_chunk), jnp.int32)
    lengths = engine.abstract_rows((rows,), jnp.int32)
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), rows))
    keys = engine.abstract_rows(keys.shape, keys.dtype)
    stop_ids = engine.abstract_rows((rows, 4), jnp.int32)
    floor = jax.ShapeDtypeStruct((), jnp.int32)
    prefill = (params, cache, logits, index, ids, lengths)
    decode = (params, cache, logits, index, keys, lengths, stop_ids, floor)  # budget: lengths'
    copy = (cache, index, index)
    return {
        "rollout_prefill_rows": (engine.program("prefill_rows", variant).lower(*prefill), prefill),
        "rollout_decode_rows": (engine.program("decode_rows", variant).lower(*decode), decode),
        "rollout_copy_rows": (engine.program("copy_rows", None).lower(*copy), copy),
    }


def _batch(mesh: Mesh, rows: int, length: int, with_ref: bool) -> dict[str, Any]:
    """Abstract batch arrays [rows, length] and [rows] (advantages, loss_norm), rows over the
    batch axes."""
    rows_2d, rows_1d = sharding.batch_sharding(mesh, 2), sharding.batch_sharding(mesh, 1)
    batch = {
        name: jax.ShapeDtypeStruct((rows, length), dtype, sharding=rows_2d)
        for name, dtype in _UPDATE_BATCH.items()
        if with_ref or name != "ref_logprobs"
    }
    for name in ("advantages", "loss_norm"):
        batch[name] = jax.ShapeDtypeStruct((rows,), jnp.float32, sharding=rows_1d)
    return batch


def compile_memory(
    name: str, lowered: Any, args: tuple, other_resident: int = 0, tpu: bool = False
) -> tuple[ProgramMemory, Any]:
    """Compiles a lowered program (`tpu`: for TPU devices); returns its ProgramMemory and the
    compiled program (None when the compiler refused it for lack of memory, the overflow then
    read from its message)."""
    with tempfile.TemporaryDirectory() as dump:
        try:
            compiled = lowered.compile({"xla_dump_to": dump} if tpu else None)
        except jax.errors.JaxRuntimeError as error:
            message = str(error)
            need = re.search(r"required for HLO temporaries \(([\d.]+)([KMGT])\)", message)
            if "RESOURCE_EXHAUSTED" not in message or not need:
                raise
            # The figure counts the program's arguments as well as its temporaries.
            total = int(float(need.group(1)) * 1024 ** "KMGT".index(need.group(2)) * 1024)
            arguments = device_bytes(args)
            memory = ProgramMemory(
                name, arguments, 0, max(total - arguments, 0), other_resident, message
            )
            return memory, None
        m = compiled.memory_analysis()
        temp = _hbm_temp_bytes(dump) if tpu else m.temp_size_in_bytes
    fresh = max(m.output_size_in_bytes - m.alias_size_in_bytes, 0)
    memory = ProgramMemory(name, m.argument_size_in_bytes, fresh, temp, other_resident)
    return memory, compiled


def _hbm_temp_bytes(dump_dir: str) -> int:
    """The HBM block a TPU program allocates for its temporaries, from the compiler's buffer
    assignment: the preallocated temporaries of the default memory space (other colours are
    on-chip memories).

    Not `memory_analysis().temp_size_in_bytes`: for a large program such as the update it reports
    several GiB more than the compiler allocates, while the compiler's own check (it refuses a
    program whose arguments and this block exceed the chip's memory) uses the block; a program
    given extra arguments is accepted exactly up to that bound.
    """
    names = [f for f in os.listdir(dump_dir) if f.endswith("-buffer-assignment.txt")]
    if len(names) != 1:
        raise RuntimeError(f"expected one buffer assignment in the compiler's dump, got {names}")
    with open(os.path.join(dump_dir, names[0])) as f:
        sizes = re.findall(r"^allocation \d+: size (\d+), preallocated-temp:", f.read(), re.M)
    return sum(int(size) for size in sizes)


def collectives(hlo_text: str) -> collections.Counter:
    """(op, result shape) -> count of the all-gathers, all-reduces and reduce-scatters in an
    optimized HLO module (`compiled.as_text()`)."""
    pattern = (
        r"= ((?:bf16|f32|f16|s32|u32|pred)\[[\d,]*\])\S* (all-gather|all-reduce|reduce-scatter)"
    )
    return collections.Counter(
        (op, shape) for shape, op in re.findall(pattern + r"(?:-start)?\(", hlo_text)
    )


def weight_gathers_per_token(hlo_text: str, params: Any) -> dict:
    """The parameter-sized all-gathers a decode program runs per generated token: those inside
    its token loop (the while loops outside any other) whose result holds at least as many
    elements as the smallest weight matrix's per-layer shard on a chip (gathered weights come
    sliced, reshaped or transposed, so sizes are compared, not shapes), counted once per trip
    of the loops inside the token loop (the layer scan). Returns {"count", "bytes"} per chip."""
    matrices = [  # per-layer shards of the weight matrices (stacked ones carry a layer axis)
        x.sharding.shard_shape(x.shape)[-2:]
        for path, x in jax.tree_util.tree_flatten_with_path(params)[0]
        if x.ndim - sharding.path_str(path).startswith("layers/") == 2
    ]
    smallest = min(math.prod(shape) for shape in matrices)
    computations = _computations(hlo_text)
    count = nbytes = 0
    for body in _outer_loop_bodies(computations, _entry(hlo_text)):
        for comp, trips in _reachable(computations, body):
            for dtype, dims in _all_gathers(computations[comp]):
                if math.prod(dims) >= smallest:
                    count += trips
                    nbytes += trips * math.prod(dims) * _HLO_BYTES[dtype]
    return {"count": count, "bytes": nbytes}


_HLO_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}
_CALLEES = r"(?:calls|to_apply|branch_computations|true_computation|false_computation)"
_LOOPS = r"(?:body|condition)"


def _computations(hlo_text: str) -> dict[str, list[str]]:
    """Computation name -> its instruction lines, from optimized HLO text."""
    out, current = {}, None
    for line in hlo_text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{\s*$", line)
        if head:
            current = out.setdefault(head.group(1), [])
        elif current is not None and line.startswith("  "):
            current.append(line.strip())
    return out


def _entry(hlo_text: str) -> str:
    return re.search(r"^ENTRY %([\w.\-]+)", hlo_text, re.M).group(1)


def _called(line: str, kinds: str) -> list[str]:
    """Names of the computations an instruction line calls through the given attributes."""
    groups = re.findall(kinds + r"=\{?(%[\w.\-]+(?:, %[\w.\-]+)*)\}?", line)
    return [name.lstrip("%") for group in groups for name in group.split(", ")]


def _outer_loop_bodies(computations: dict[str, list[str]], root: str) -> list[str]:
    """The bodies of the while loops root runs that no other loop encloses."""
    bodies, stack = [], [root]
    while stack:
        for line in computations.get(stack.pop(), []):
            if " while(" in line:
                bodies += _called(line, "body")
            else:
                stack += _called(line, _CALLEES)
    return bodies


def _reachable(computations: dict[str, list[str]], root: str) -> list[tuple[str, int]]:
    """(computation, times it runs per run of root) for root and everything it calls; a while
    loop's body and condition count its trip count (`_trip_count`)."""
    out, stack = [], [(root, 1)]
    while stack:
        comp, times = stack.pop()
        out.append((comp, times))
        for line in computations.get(comp, []):
            inner = times * _trip_count(computations, line) if " while(" in line else times
            stack += [(name, times) for name in _called(line, _CALLEES)]
            stack += [(name, inner) for name in _called(line, _LOOPS)]
    return out


def _trip_count(computations: dict[str, list[str]], while_line: str) -> int:
    """A while loop's trip count: XLA's known_trip_count, else the one integer constant its
    condition compares against (a scan's length), else 1."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"', while_line)
    if known:
        return int(known.group(1))
    condition = _called(while_line, "condition")
    lines = computations.get(condition[0], []) if condition else []
    scalar = r"s32\[\]\S* constant\((\d+)\)"
    constants = {int(c) for line in lines for c in re.findall(scalar, line)}
    return constants.pop() if len(constants) == 1 else 1


def _all_gathers(lines: list[str]) -> list[tuple[str, list[int]]]:
    """(dtype, dims) of the results of the all-gathers among instruction lines."""
    found = []
    for line in lines:
        m = re.search(r"= (.*?) all-gather(?:-start)?\(", line)
        if not m:
            continue
        # An async start's result is a tuple (operand, result): the result's shape is last.
        dtype, dims = re.findall(r"(\w+)\[([\d,]*)\]", m.group(1))[-1]
        if dtype in _HLO_BYTES:
            found.append((dtype, [int(d) for d in dims.split(",") if d]))
    return found


def device_bytes(tree: Any, memory_kind: str = "device") -> int:
    """Bytes one device holds in its memory (or in its host's memory: memory_kind="pinned_host")
    of a pytree of sharded arrays or ShapeDtypeStructs."""
    total = 0
    for x in jax.tree.leaves(tree):
        if (x.sharding.memory_kind or "device") != memory_kind:
            continue
        shard = x.sharding.shard_shape(x.shape)
        total += math.prod(shard) * x.dtype.itemsize  # PRNG keys included
    return total


def target_devices(topology: str) -> list[Any]:
    """The devices to compile for: the abstract devices of a TPU topology (e.g. "v5e:2x4",
    "v5p:2x2x1", "v4:2x2x1"; v4 chips in megacore mode), or this host's devices when empty.

    Raises:
      ConfigError: an unknown topology, or libtpu missing.
    """
    if not topology:
        return jax.devices()
    from jax.experimental import topologies

    kwargs = {"chip_config_name": "megacore"} if topology.startswith("v4") else {}
    if all(n == "1" for n in topology.partition(":")[2].split("x")):  # one chip (v5e-1, v6e-1)
        kwargs["chips_per_host_bounds"] = (1, 1, 1)
    try:
        return list(topologies.get_topology_desc(topology, "tpu", **kwargs).devices)
    except Exception as error:  # noqa: BLE001  (libtpu missing or a bad name: say which)
        raise config_lib.ConfigError(
            f"--config.aot.topology={topology!r}: {type(error).__name__}: {error} (compiling "
            "for a TPU topology needs libtpu: pip install 'libtpu==0.0.42.*')"
        ) from error


def host_topology(topology: str, devices: list[Any]) -> str:
    """The topology name of one host's chips of a multi-host topology ("v5e:4x4" -> "v5e:2x2"):
    the extent of process 0's chip coordinates."""
    kind, shape = topology.split(":")
    mine = [d.coords for d in devices if d.process_index == 0]
    extent = [max(c[i] for c in mine) - min(c[i] for c in mine) + 1 for i in range(3)]
    return f"{kind}:{'x'.join(str(e) for e in extent[: len(shape.split('x'))])}"


def hbm_bytes(device: Any) -> int:
    """Memory of one chip (TPU by device kind, a GPU from its allocator's limit; a CPU device
    gets its share of host memory)."""
    if device.platform == "gpu":
        return int(device.memory_stats()["bytes_limit"])
    if device.platform == "tpu":
        if device.device_kind not in estimate.CHIPS:
            raise config_lib.ConfigError(f"unknown TPU kind {device.device_kind!r}")
        return int(estimate.CHIPS[device.device_kind].available_hbm_gib * GIB)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return host // len(jax.local_devices())


def check(
    config: Any, cfg: QwenConfig | Qwen35Config, workdir: str, topology: str | None = None
) -> dict:
    """`run.py --mode=compile`: compiles every program a training step runs at the config's
    largest shapes for `config.aot.topology`, prints a per-chip table, writes
    `<workdir>/compile.json` (and `<workdir>/hlo/<program>.txt` with `aot.dump_hlo`), and returns
    the report. topology: overrides `config.aot.topology` ("" for this host's devices, as a
    training run checks itself).

    Raises:
      DoesNotFit: a program needs more than a chip's memory (names it, by how much, and what
        would reduce it).
    """
    from seal_jax import rollout

    topology = config.aot.topology if topology is None else topology
    devices = target_devices(topology)
    mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, devices)
    model = abstract_model(
        cfg,
        mesh,
        config_lib.dtype(config.model.param_dtype),
        config_lib.dtype(config.model.compute_dtype),
    )
    length = config.rollout.context_limit
    engine_config = rollout.EngineConfig.from_config(
        config.rollout, config.rollout.max_new_tokens, stop_ids=(0,)
    )
    layout = weight_sync.sampling_layout(
        config.rollout.sampler_tensor, model.compute_dtype, devices
    )
    if layout and len({d.process_index for d in devices}) > 1:
        # Rollouts are host-local: compiled for one host's chips as a topology of their own
        # (the compiler takes a program's devices to be the whole of its topology).
        local = target_devices(host_topology(topology, devices))
        group = layout.mesh.shape["tensor"]
        local_mesh = weight_sync.sampling_layout(group, model.compute_dtype, local).mesh
        layout = dataclasses.replace(layout, mesh=local_mesh)
    engine = rollout.RolloutEngine(
        cfg, layout.mesh if layout else mesh, engine_config, model.compute_dtype, layout
    )
    updater = update_lib.build_updater(config, model)
    reference = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, model.compute_dtype, sharding=x.sharding),
        model.params,
    )
    opt_state = abstract_opt_state(updater, model.params)
    resident = {
        "params": device_bytes(model.params),
        "opt_state": device_bytes(opt_state),
        "reference": device_bytes(reference) if config.rl.kl_coef > 0 else 0,
    }
    on_host = {  # per chip, in its host's memory
        "reference": resident["reference"] if config.rl.reference_on_host else 0,
        "opt_state": device_bytes(opt_state, optim.HOST),
    }
    # The reference is on the chips during its own pass, and between passes unless on host.
    reference_beside = resident["reference"] - on_host["reference"]
    lowered = {
        **lower_update(updater, model, length),
        "logprob_pass": lower_logprobs(updater, model, length),
        **lower_rollout(config, model, engine),
    }
    _, decode_args = lowered["rollout_decode"]
    resident["kv_cache"] = device_bytes(decode_args[1])  # (params, cache, logits, ...)
    # With a sampling layout the rollout reads its copy; the trainer's params wait beside it.
    resident["sampling_copy"] = device_bytes(decode_args[0]) if layout else 0
    rollout_beside = resident["opt_state"] + reference_beside
    rollout_beside += resident["params"] if layout else 0
    beside = {  # resident state alive during each program that it does not take as an argument
        "update_micro_step": reference_beside,
        "update_optimizer_step": reference_beside,
        "logprob_pass": resident["opt_state"] + resident["reference"],
        "sampling_copy": resident["opt_state"] + reference_beside,
        "rollout_prefill": rollout_beside,
        "rollout_decode": rollout_beside,
        "rollout_prefill_rows": rollout_beside,
        "rollout_decode_rows": rollout_beside,
        "rollout_copy_rows": rollout_beside,
    }
    programs, tpu, gathers = [], devices[0].platform == "tpu", {}
    for name, (low, args) in lowered.items():
        program, compiled = compile_memory(name, low, args, beside[name], tpu)
        programs.append(program)
        if compiled is not None and name == "rollout_decode":
            gathers = weight_gathers_per_token(compiled.as_text(), decode_args[0])
        if compiled is not None and config.aot.dump_hlo and jax.process_index() == 0:
            (epath.Path(workdir) / "hlo").mkdir(parents=True, exist_ok=True)
            (epath.Path(workdir) / "hlo" / f"{name}.txt").write_text(compiled.as_text())
    report = _report(config, topology, devices, resident, programs)
    report["host_bytes_per_chip"] = on_host
    report["decode_weight_gathers_per_token"] = gathers
    hosts = len({d.process_index for d in devices})
    report["estimate"] = estimate.step_estimate(
        config, cfg, devices[0].device_kind, len(devices), hosts, gathers.get("bytes", 0)
    )
    if jax.process_index() == 0:  # every process compiles the same programs
        epath.Path(workdir).mkdir(parents=True, exist_ok=True)
        (epath.Path(workdir) / "compile.json").write_text(json.dumps(report, indent=2))
        print(format_table(report))
    if not report["fits"]:
        worst = max(programs, key=lambda p: p.peak_bytes)
        over = (worst.peak_bytes - report["hbm_bytes_per_chip"]) / GIB
        raise DoesNotFit(
            f"{worst.name} needs {worst.peak_bytes / GIB:.2f} GiB per chip, {over:.2f} GiB more "
            f"than the {report['hbm_bytes_per_chip'] / GIB:.2f} GiB of a {report['device_kind']} "
            f"chip: {_advice(worst.name)} (details in {epath.Path(workdir) / 'compile.json'})"
        )
    return report


def _advice(program: str) -> str:
    """The settings that shrink a program's memory."""
    if program.startswith("rollout"):
        return (
            "fewer rows per rollout chunk (rollout.micro_batch_tasks or rollout.slots), a shorter "
            "rollout.context_limit, or more chips"
        )
    return (
        "fewer rows per micro-step (optim.grad_accum, train.mini_batch_tasks), a shorter "
        "rollout.context_limit, optim.mu_dtype=bfloat16, Adam's state in host memory "
        "(optim.moments_on_host), or more chips (mesh.fsdp)"
    )


def _report(
    config: Any, topology: str, devices: list, resident: dict, programs: list[ProgramMemory]
) -> dict:
    """The JSON record of a compile check."""
    hbm = hbm_bytes(devices[0])
    fits = [p.peak_bytes <= hbm and not p.error for p in programs]
    return {
        "fits": all(fits),
        "topology": topology or "local",
        "device_kind": devices[0].device_kind,
        "chips": len(devices),
        "hbm_bytes_per_chip": hbm,
        "resident_bytes_per_chip": resident,
        "settings": {
            "context_limit": config.rollout.context_limit,
            "update_rows_per_micro_step": update_lib.micro_batch_rows(config),
            "rollout_rows": episodes.chunk_rows(config),
            "param_dtype": config.model.param_dtype,
            "compute_dtype": config.model.compute_dtype,
            "mesh": dict(config.mesh),
        },
        "programs": [
            {**dataclasses.asdict(p), "peak_bytes_per_chip": p.peak_bytes, "fits": fit}
            for p, fit in zip(programs, fits)
        ],
    }


def format_table(report: dict) -> str:
    """The compile report as a per-chip table (GiB)."""
    hbm = report["hbm_bytes_per_chip"] / GIB
    chips = f"{report['chips']} x {report['device_kind']} ({report['topology']})"
    columns = ("arguments", "temp", "outputs", "beside", "peak")
    lines = [
        f"{chips}, {hbm:.2f} GiB per chip",
        "resident: "
        + ", ".join(f"{k} {v / GIB:.2f}" for k, v in report["resident_bytes_per_chip"].items())
        + "".join(
            f", {k} on host {v / GIB:.2f}"
            for k, v in report.get("host_bytes_per_chip", {}).items()
            if v
        ),
        f"{'program':<22}" + "".join(f"{c:>10}" for c in columns) + "  fits",
    ]
    for p in report["programs"]:
        sizes = (p["argument_bytes"], p["temp_bytes"], p["output_bytes"], p["other_resident_bytes"])
        cells = "".join(f"{b / GIB:>10.2f}" for b in (*sizes, p["peak_bytes_per_chip"]))
        lines.append(f"{p['name']:<22}{cells}  {'yes' if p['fits'] else 'NO'}")
    e = report.get("estimate")
    if e:
        lines.append(
            f"estimate per step: update {e['update_s_per_step']:.0f} s, rollout "
            f"{e['rollout_s_per_step']:.0f} s; the paper's 72 steps {e['paper_run_hours']:.1f} h "
            f"({e['assumptions']})"
        )
        d = e["decode"]
        layout = (
            f"groups of {d['sampler_group_chips']} chips"
            if d["sampler_group_chips"]
            else ("the trainer's layout")
        )
        lines.append(
            f"decode ({layout}): {d['bytes_per_chip_per_step'] / GIB:.2f} GiB read per chip per "
            f"step, {d['tokens_per_s_per_chip']:.0f} tokens/s per chip; sampling "
            f"copy {d['copy_s']:.2f} s"
        )
    gathers = report.get("decode_weight_gathers_per_token")
    if gathers:
        lines.append(
            f"decode: {gathers['count']} weight all-gathers per token in its loop, "
            f"{gathers['bytes'] / GIB:.2f} GiB per chip"
        )
    return "\n".join(lines)
