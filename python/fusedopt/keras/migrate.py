"""Moving a Keras 2 model trained with tensorflow-addons' LazyAdam to Keras 3.

Keras 3 loads a Keras 2 ``.h5`` model (``keras.models.load_model(path, compile=False)``:
layers and weights) but not its optimizer state: it restores optimizer weights by position,
and Keras 2 saves them as ``[iter, m_1..m_n, v_1..v_n]`` where Keras 3's Adam has
``[iterations, learning_rate, m_1, v_1, ...]``, so the state is dropped with a warning and
Adam restarts from step 1 with zero moments. Here the state moves by name:

    model = keras.models.load_model("tfa_model.h5", compile=False)
    optimizer = migrate.lazy_adam_from_h5("tfa_model.h5")   # fusedopt.keras.LazyAdam, same
    model.compile(optimizer=optimizer, loss="mse")           # learning rate, betas, epsilon
    migrate.restore_optimizer_state(optimizer, model.trainable_variables, "tfa_model.h5")
    model.fit(...)                                           # continues as tfa would

Works for the Adam family's ``m``/``v`` slots: ``Addons>LazyAdam``,
``tf.keras.optimizers.legacy.Adam``, ``fusedopt.keras.legacy.LazyAdam`` (docs/MIGRATING.md).
"""
import json

import numpy as np

__all__ = ["keras2_optimizer_config", "lazy_adam_from_h5", "restore_optimizer_state"]


def _h5(path):
    import h5py

    return h5py.File(path, "r")


def _decode(value):
    return value.decode("utf-8") if isinstance(value, bytes) else value


def keras2_optimizer_config(path):
    """The optimizer a Keras 2 .h5 file was compiled with: {"class_name", "config"}."""
    with _h5(path) as f:
        training_config = f.attrs.get("training_config")
    if training_config is None:
        raise ValueError(f"{path} has no training configuration (saved without compile?)")
    return json.loads(_decode(training_config))["optimizer_config"]


def lazy_adam_from_h5(path, **overrides):
    """A ``fusedopt.keras.LazyAdam`` with the hyper-parameters the .h5 file's Adam-family
    optimizer had (learning rate or schedule, beta_1, beta_2, epsilon, amsgrad, name);
    keyword arguments override them. Keras 3 has no ``decay``: a nonzero one is refused
    (use a ``keras.optimizers.schedules.InverseTimeDecay`` learning rate instead)."""
    import keras

    from fusedopt.keras import LazyAdam

    config = dict(keras2_optimizer_config(path)["config"])
    decay = config.pop("decay", 0.0)
    if decay and "learning_rate" not in overrides:
        raise ValueError(f"{path}: the optimizer had decay={decay}, which Keras 3 does not "
                         "have; pass learning_rate=keras.optimizers.schedules."
                         "InverseTimeDecay(...) (the same schedule)")
    learning_rate = config.get("learning_rate", 0.001)
    if isinstance(learning_rate, dict):  # a serialized LearningRateSchedule
        learning_rate = keras.optimizers.schedules.deserialize(learning_rate)
    kwargs = dict(learning_rate=learning_rate,
                  **{k: config[k] for k in ("beta_1", "beta_2", "epsilon", "amsgrad", "name")
                     if k in config})
    kwargs.update(overrides)
    return LazyAdam(**kwargs)


def _saved_weights(path):
    with _h5(path) as f:
        if "optimizer_weights" not in f:
            raise ValueError(f"{path} holds no optimizer weights (saved with "
                             "include_optimizer=False, or before the first training step)")
        group = f["optimizer_weights"]
        names = [_decode(n) for n in group.attrs["weight_names"]]
        return {name: np.asarray(group[name]) for name in names}, names


def _slot_arrays(weights, names, slot, prefix):
    """[(variable name, array)] of one slot, in the saved order."""
    suffix = f"/{slot}:0"
    return [(n[len(prefix):-len(suffix)], weights[n]) for n in names
            if n.startswith(prefix) and n.endswith(suffix)]


def restore_optimizer_state(optimizer, variables, path):
    """Builds the Keras 3 Adam-family `optimizer` (e.g. ``fusedopt.keras.LazyAdam``) for
    `variables` (the model's ``trainable_variables``) and sets its step count and ``m``/``v``
    moments from the Keras 2 .h5 file at `path`.

    Each variable gets the slots saved under its own name (``<optimizer>/<layer>/<weight>/m``);
    where the names differ (e.g. layers renamed), slots are taken in the saved order, which
    Keras 2 makes the model's trainable-variable order. Shapes are checked either way."""
    weights, names = _saved_weights(path)
    iteration = [n for n in names if n.endswith("/iter:0")]
    if len(iteration) != 1:
        raise ValueError(f"{path}: expected one '<optimizer>/iter:0' weight, found {iteration}")
    prefix = iteration[0][:-len("iter:0")]
    if any(n.endswith("/vhat:0") for n in names):
        raise ValueError(f"{path}: amsgrad state (vhat) is not migrated")
    variables = list(variables)
    optimizer.build(variables)
    for slot, slots in (("m", optimizer._momentums), ("v", optimizer._velocities)):
        saved = _slot_arrays(weights, names, slot, prefix)
        by_name = dict(saved)
        if len(saved) != len(variables):
            raise ValueError(f"{path} has '{slot}' for {len(saved)} variables, the model "
                             f"has {len(variables)} trainable variables")
        for position, variable in enumerate(variables):
            value = by_name.get(variable.path, saved[position][1])
            if tuple(value.shape) != tuple(variable.shape):
                raise ValueError(f"{path}: '{slot}' for {variable.path} has shape "
                                 f"{value.shape}, the variable {tuple(variable.shape)}")
            slots[optimizer._get_variable_index(variable)].assign(value)
    optimizer.iterations.assign(int(weights[iteration[0]]))
