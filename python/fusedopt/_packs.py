"""Member packs: a group update's variables and slots behind one handle.

Why: a ``tf.function``'s per-call cost grows with its captured inputs (~2 us each in TF's
call path). The list group op of 1,000 variables captures 3,000 handles (variables and
two slots each); the packed op (``ops.resource_packed_group_apply_<rule>``) captures one
``FusedOpt>VariablePack`` handle instead. Same kernel, same numbers.

What keeps it correct:
  * Order. Automatic control dependencies order ops by the resource handles they take; a
    pack hides its members: ``_pack_registry`` (below ``ops``) records every pack's
    members and registers the resolver that orders an op taking a pack as writing them.
  * Lifetime. A pack holds the member ``tf.Variable`` objects, so their handles (and the
    ids the cache and the resolver key on) stay unique while it lives.
  * SavedModel. A pack is a ``TrackableResource``: a saved step function that captures it
    re-creates it from the restored variables on load (the optimizer lists its packs as
    SavedModel children; checkpoints do not see them).

Packs are made only where they can be: TF2 behaviour (eager, or a function traced from
eager code), not inside XLA compilation (the packed op has no XLA kernel: the list op
does), variables whose handles are eager tensors.
"""
import collections
import copy

from typing import Any, List, Sequence

import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

from fusedopt import ops, reference

# Packs per optimizer: one per (members, device) seen; the oldest goes past this (a group
# whose membership changes every step, e.g. a gradient that is sometimes None).
__all__ = ["MAX_PACKS", "PackCache", "PacksOfOptimizer", "packable"]

MAX_PACKS = 16

class _Pack(tf.saved_model.experimental.TrackableResource):
    """One ``FusedOpt>VariablePack`` of ``members`` (``tf.Variable`` objects, op order)."""

    def __init__(self, members, device, dependencies=None):
        super().__init__(device=device)
        self._members = tuple(members)
        # The members a SavedModel lists as the pack's dependencies: all but those the
        # optimizer tracks itself as slot variables (Keras 2's, which may be no other
        # object's dependency). Either way they are restored before the pack is re-made.
        self._dependencies = tuple(members if dependencies is None else dependencies)

    def _create_resource(self):
        return ops.variable_pack(list(self._members))

    # SavedModel: the members are the pack's dependencies (exported, and on load
    # restored, before it), and the exported pack is made from the exported members.
    def _trackable_children(self, save_type="checkpoint", **kwargs):
        children = super()._trackable_children(save_type, **kwargs)
        if save_type == "savedmodel":
            children.update({"member_%d" % i: m for i, m in enumerate(self._dependencies)})
        return children

    def _deserialization_dependencies(self, children):
        return {name: child for name, child in children.items() if name.startswith("member_")}

    def _export_to_saved_model_graph(self, object_map, tensor_map, **unused_kwargs):
        exported = copy.copy(self)
        exported._members = tuple(object_map.get(m, m) for m in self._members)
        with tf.device(self._resource_device):
            exported._resource_handle = exported._create_resource()
        object_map[self] = exported
        tensor_map[self.resource_handle] = exported._resource_handle
        return [self.resource_handle]

    def handle(self):
        """The pack's (eager) handle, made on first use."""
        with tf.init_scope():
            return self.resource_handle


class PackCache:
    """An optimizer's packs, by members and device (least recently used dropped first)."""

    def __init__(self, slot_variables=None):
        self._packs = collections.OrderedDict()
        self._slot_variables = slot_variables or (lambda: ())

    def packs(self) -> List[Any]:
        return list(self._packs.values())

    def handle(self, members: Sequence[tf.Variable], device: str) -> tf.Tensor:
        # A cached pack holds its members: their ids cannot be reused while it is here.
        key = (tuple(id(m) for m in members), device)
        pack = self._packs.get(key)
        if pack is None:
            with tf.init_scope(), tf.device(device or None):
                slots = {id(v) for v in self._slot_variables()}
                pack = _Pack(members, device, [m for m in members if id(m) not in slots])
                handle = pack.handle()
            self._packs[key] = pack
            while len(self._packs) > MAX_PACKS:
                self._packs.popitem(last=False)
        else:
            self._packs.move_to_end(key)
            handle = pack.handle()
        return handle


class PacksOfOptimizer:
    """Mixin for the optimizer front ends: the optimizer's ``PackCache``, and its packs as
    SavedModel children (never in checkpoints)."""

    def _fused_packs(self):
        # Not an attribute Keras or tf.train.Checkpoint would track: packs hold no state,
        # and a checkpoint must not depend on which groups a step happened to pack.
        cache = self.__dict__.get("_fusedopt_pack_cache")
        if cache is None:
            cache = self.__dict__["_fusedopt_pack_cache"] = PackCache(self._fused_slot_variables)
        return cache

    def _fused_slot_variables(self):
        """The variables the optimizer tracks as checkpoint slot variables (Keras 2's);
        Keras 3's slots are plain tracked variables."""
        return ()

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        # A SavedModel of a step function that captured a pack needs the pack (it is
        # re-created from the restored variables on load).
        children = super()._trackable_children(save_type, **kwargs)
        cache = self.__dict__.get("_fusedopt_pack_cache")
        if save_type == "savedmodel" and cache is not None:
            for i, pack in enumerate(cache.packs()):
                children["_fusedopt_pack_%d" % i] = pack
        return children


def packable(variables: Sequence[Any]) -> bool:
    """Whether these (unwrapped, resource) variables can go in a pack here."""
    if not tf.compat.v1.executing_eagerly_outside_functions():
        return False  # a TF1 graph: nothing eager to hold
    if not tf.executing_eagerly() and reference._in_xla_context():
        return False
    with tf.init_scope():
        return all(isinstance(getattr(v, "handle", None), tf_ops.EagerTensor) for v in variables)
