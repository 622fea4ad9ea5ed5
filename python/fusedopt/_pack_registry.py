"""Which variables a member pack holds, and the ordering rule that follows from it.

Below ``ops`` (which registers every eager pack it makes here) and ``_packs`` (the packs
the optimizers keep): nothing here imports either.

Automatic control dependencies order ops by the resource handles they take; a pack hides
its members. ``_order_members`` (an ACD resource resolver, registered on import) makes
any op that takes a pack, directly or through a function call, cond or loop that captures
one, count as writing every member captured in its graph: reads and writes of those
variables in the same function run before or after it in program order, exactly as with
the list op.
"""
import weakref
from typing import Any, List, Optional, Sequence

from tensorflow.python.framework import auto_control_deps
from tensorflow.python.framework import ops as tf_ops

# id(pack handle) -> (weakref to the handle, the members' handles): every pack made
# eagerly (ops.variable_pack registers it), for the resolver. The weakref check keeps a
# reused id from matching; the members' handles are held so their ids stay theirs.
_handles = {}

__all__ = ["PACK_OP", "register", "pack_members"]

PACK_OP = "FusedOpt>VariablePack"


def register(handle: Any, member_handles: Sequence[Any]) -> None:
    """Records an eager pack handle and its members' (eager) handles."""
    key = id(handle)
    entry = (weakref.ref(handle), tuple(member_handles))
    _handles[key] = entry
    weakref.finalize(handle, _forget, key, entry)


def _forget(key, entry):
    if _handles.get(key) is entry:
        del _handles[key]


# --- ordering: the ACD resource resolver -------------------------------------------------

# graph -> (graph.version, {tensor id of a captured placeholder: its external tensor},
#           {id of a capture chain's root: [the graph's placeholders for it]}).
_capture_maps = weakref.WeakKeyDictionary()


def _captures(graph):
    stamp = graph.version
    cached = _capture_maps.get(graph)
    if cached is not None and cached[0] == stamp:
        return cached
    captures = list(getattr(graph, "captures", ()))
    external_of = {tf_ops.tensor_id(internal): external for external, internal in captures}
    by_root = {}  # (_root reads only outer graphs' maps: externals are never in `graph`)
    for external, internal in captures:
        by_root.setdefault(id(_root(external)), []).append(internal)
    cached = (stamp, external_of, by_root)
    _capture_maps[graph] = cached
    return cached


def _root(tensor):
    """Where a tensor comes from: through Identity ops and function captures (nested
    functions, cond and loop bodies) to an eager tensor or a graph tensor that is neither."""
    for _ in range(256):  # a bound on nesting: functions in functions
        if isinstance(tensor, tf_ops.EagerTensor):
            return tensor
        op = tensor.op
        if op.type == "Identity":
            tensor = op.inputs[0]
            continue
        external = (_captures(tensor.graph)[1].get(tf_ops.tensor_id(tensor))
                    if op.type == "Placeholder" else None)
        if external is None:
            return tensor
        tensor = external
    return tensor


def pack_members(pack: Any) -> Optional[List[Any]]:
    """The roots of a pack tensor's members (see _root), or None when it cannot be told
    which pack it is (e.g. a tf.function argument: a different pack each call)."""
    root = _root(pack)
    if isinstance(root, tf_ops.EagerTensor):
        entry = _handles.get(id(root))
        if entry is None or entry[0]() is not root:
            return None
        return entry[1]
    if root.op.type == PACK_OP:
        return [_root(t) for t in root.op.inputs]
    return None


def _in_graph(graph, roots):
    """The tensors of `graph` that ops on these roots take: its own, or its captures."""
    by_root = _captures(graph)[2]
    found = []
    for root in roots:
        if not isinstance(root, tf_ops.EagerTensor) and root.graph is graph:
            found.append(root)
        found.extend(by_root.get(id(root), ()))
    return found


@auto_control_deps.register_acd_resource_resolver
def _order_members(op, resource_reads, resource_writes):
    """An op that takes a pack writes every member that is in its graph."""
    if not (resource_reads or resource_writes):
        return False
    added = False
    for resource in list(resource_writes) + list(resource_reads):
        if resource.op.type not in ("Placeholder", "Identity", PACK_OP):
            continue
        if resource.op.type == "Placeholder" and not _handles:
            continue  # no eager pack exists: a captured placeholder cannot be one
        members = pack_members(resource)
        if not members:
            continue
        for tensor in _in_graph(op.graph, members):
            if tensor not in resource_writes:
                resource_writes.add(tensor)
                resource_reads.discard(tensor)
                added = True
    return added
