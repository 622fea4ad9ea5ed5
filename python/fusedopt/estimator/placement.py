"""Where the towers' ops and the shared variables go."""
from typing import Any, Callable, List, Sequence

import tensorflow as tf

__all__ = ["PLACEMENTS", "canonical_device", "local_devices", "consolidation_device",
           "variable_device_fn", "tower_device_fn"]

PLACEMENTS = ("consolidation", "round_robin")

_VARIABLE_OPS = frozenset((
    "Variable", "VariableV2", "AutoReloadVariable", "VarHandleOp", "MutableHashTable",
    "MutableHashTableV2", "MutableHashTableOfTensors", "MutableHashTableOfTensorsV2",
    "MutableDenseHashTable", "MutableDenseHashTableV2"))


def canonical_device(device: str) -> str:
    """'/gpu:0' -> '/device:GPU:0': the spelling TF gives placed ops (and contrib gave)."""
    return tf.DeviceSpec.from_string(device).to_string()


def _merged(device, op_device):
    """`device` with what the op's own (partial) device names taking precedence."""
    spec = tf.DeviceSpec.from_string(device)
    return spec.make_merged_spec(tf.DeviceSpec.from_string(op_device or "")).to_string()


def local_devices() -> List[str]:
    """All local GPUs, else all local CPU devices."""
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if gpus:
        return gpus
    return [d.name for d in tf.config.list_logical_devices("CPU")] or ["/device:CPU:0"]


def consolidation_device(devices: Sequence[str]) -> str:
    """Where variables (by default) and merged results go: the one device, else the CPU."""
    if len(devices) == 1:
        return devices[0]
    return "/device:CPU:0"


def variable_device_fn(placement: str, devices: Sequence[str],
                       consolidation: str) -> Callable[[Any], str]:
    """op -> device of a variable op: all on `consolidation`, or round robin over devices."""
    if placement == "consolidation":
        return lambda op: consolidation
    created = [0]

    def round_robin(op):
        device = devices[created[0] % len(devices)]
        created[0] += 1
        return device
    return round_robin


def tower_device_fn(tower_device: str,
                    variable_device: Callable[[Any], str]) -> Callable[[Any], str]:
    """The device function of one tower: its ops on its device, variables elsewhere.

    A device the op already names (an explicit ``tf.device`` inside the model_fn, even a
    partial one like '/job:ps') wins field by field over the tower's.
    """
    def device_fn(op):
        target = variable_device(op) if op.type in _VARIABLE_OPS else tower_device
        return _merged(target, op.device)
    return device_fn
