"""Where the towers' ops and the shared variables go."""
import tensorflow as tf

PLACEMENTS = ("consolidation", "round_robin")

_VARIABLE_OPS = frozenset((
    "Variable", "VariableV2", "AutoReloadVariable", "VarHandleOp", "MutableHashTable",
    "MutableHashTableV2", "MutableHashTableOfTensors", "MutableHashTableOfTensorsV2",
    "MutableDenseHashTable", "MutableDenseHashTableV2"))


def local_devices():
    """All local GPUs, else all local CPU devices."""
    gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
    if gpus:
        return gpus
    return [d.name for d in tf.config.list_logical_devices("CPU")] or ["/device:CPU:0"]


def consolidation_device(devices):
    """Where variables (by default) and merged results go: the one device, else the CPU."""
    if len(devices) == 1:
        return devices[0]
    return "/device:CPU:0"


def variable_device_fn(placement, devices, consolidation):
    """op -> device of a variable op: all on `consolidation`, or round robin over devices."""
    if placement == "consolidation":
        return lambda op: consolidation
    created = [0]

    def round_robin(op):
        device = devices[created[0] % len(devices)]
        created[0] += 1
        return device
    return round_robin


def tower_device_fn(tower_device, variable_device):
    """The device function of one tower: its ops on its device, variables elsewhere."""
    def device_fn(op):
        if op.device:  # already placed (colocation or an explicit device)
            return op.device
        if op.type in _VARIABLE_OPS:
            return variable_device(op)
        return tower_device
    return device_fn
