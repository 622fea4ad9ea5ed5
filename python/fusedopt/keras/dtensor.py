"""Fused Adagrad for DTensor meshes (tf_keras's DTensor optimizer support).

``fusedopt.keras.dtensor.Adagrad`` has the signature of
``tf.keras.dtensor.experimental.optimizers.Adagrad``:

    Adagrad(learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-07,
            gradients_clip_option=None, ema_option=None, name="Adagrad", mesh=None)

and subclasses the Keras 2 optimizer that implements it (tf_keras on TF >= 2.16,
tf.keras on TF 2.15): the accumulator takes the layout of its model variable,
``iterations`` and the learning rate live replicated on ``mesh``. Variables with a
fully replicated layout (and plain variables) are updated by fusedopt's op when the
step runs eagerly; DTensor cannot run a custom op on sharded inputs, nor inside a
``tf.function`` (its SPMD pass has no layout propagation for custom ops), so there the
same rule runs in composed TF ops. The rule is Keras's: ``var -= lr*g/sqrt(accumulator + epsilon)``.

``gradients_clip_option`` / ``ema_option`` are the option objects of the original
DTensor optimizer API (anything with ``clipnorm``/``clipvalue``/``global_clipnorm``,
resp. ``use_ema``/``ema_momentum``/``ema_overwrite_frequency`` attributes, or dicts of
them); they map to the base optimizer's keyword arguments, which are also accepted.
"""

import tensorflow as tf

from fusedopt import rules as _rules
from fusedopt import _dispatch
from fusedopt.keras import _FusedUpdate
from fusedopt.keras.legacy import _keras2

_keras = _keras2()
_register = _keras.utils.register_keras_serializable(package="fusedopt.dtensor")

__all__ = ["Adagrad"]

_CLIP = ("clipnorm", "clipvalue", "global_clipnorm")
_EMA = ("use_ema", "ema_momentum", "ema_overwrite_frequency")


def _option_kwargs(option, names):
    if option is None:
        return {}
    get = option.get if isinstance(option, dict) else (lambda n: getattr(option, n, None))
    return {n: get(n) for n in names if get(n) is not None}


def _needs_composed(variable, on_mesh):
    """True for DTensor variables the custom op cannot update: sharded layouts, and any
    DTensor inside a traced function (DTensor's SPMD pass has no layout propagation for
    custom ops; eagerly, it runs them on replicated layouts)."""
    if not tf.executing_eagerly():  # layouts cannot be fetched while tracing
        return on_mesh or isinstance(variable, tf.experimental.dtensor.DVariable)
    try:
        layout = tf.experimental.dtensor.fetch_layout(variable)
    except Exception:  # noqa: BLE001 - not a DTensor: a plain variable
        return False
    return layout is not None and not layout.is_fully_replicated()


@_register
class Adagrad(_FusedUpdate, _keras.optimizers.Adagrad):
    """Adagrad on DTensor meshes: fused op for replicated layouts in eager steps, the
    composed form for sharded layouts and inside ``tf.function``."""

    def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-07,
                 gradients_clip_option=None, ema_option=None, name="Adagrad", mesh=None,
                 **kwargs):
        kwargs.update(_option_kwargs(gradients_clip_option, _CLIP))
        kwargs.update(_option_kwargs(ema_option, _EMA))
        if mesh is not None:
            kwargs["mesh"] = mesh
        super().__init__(learning_rate=learning_rate,
                         initial_accumulator_value=initial_accumulator_value,
                         epsilon=epsilon, name=name, **kwargs)

    def get_config(self):
        config = super().get_config()
        config.pop("mesh", None)  # a Mesh is not serializable; pass mesh= to from_config
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None, mesh=None):
        config = dict(config)
        if mesh is not None:
            config["mesh"] = mesh
        return super().from_config(config, custom_objects=custom_objects)

    def add_variable_from_reference(self, model_variable, variable_name, shape=None,
                                    initial_value=None):
        # Keras copies a given initial value (the accumulator's constant) to the mesh
        # replicated; lay it out like the model variable instead, as zeros_like does.
        mesh = getattr(self, "_mesh", None)
        if mesh is None or initial_value is None or shape is not None:
            return super().add_variable_from_reference(model_variable, variable_name, shape,
                                                       initial_value)
        dt = tf.experimental.dtensor
        with tf.init_scope():
            value = dt.copy_to_mesh(
                tf.convert_to_tensor(initial_value),
                dt.Layout.replicated(mesh, rank=len(model_variable.shape)))
            value = dt.relayout(value, dt.fetch_layout(model_variable))
            variable = dt.DVariable(
                initial_value=value, name=f"{variable_name}/{model_variable._shared_name}",
                dtype=getattr(model_variable, "true_dtype", model_variable.dtype),
                trainable=False)
        self._variables.append(variable)
        return variable

    # The update is the KERAS spec of the adagrad rule (fusedopt.keras.Adagrad's), with
    # the composed form wherever DTensor cannot run the custom op.
    _fused_rule = "adagrad"
    _fused_spec = _rules.module("adagrad").KERAS

    def _fused(self, rule, variable, slots, gradient, hyper, options=None):
        on_mesh = bool(getattr(self, "_mesh", None)) or \
            bool(getattr(self, "_run_with_dtensor", False))
        return _dispatch.apply(rule, variable, slots, gradient, hyper, options,
                               composed=self._fused_composed or _needs_composed(variable, on_mesh))
