"""Training loops for test_resume.py, runnable in a fresh process.

    python resume_worker.py MODE PHASE CKPT_DIR OUT_NPZ FIRST LAST

MODE: "checkpoint" (eager, resource variables, tf.train.Checkpoint), "saver"
(tf.compat.v1 graph, ref variables and ops, tf.compat.v1.train.Saver), "v1optimizer"
(fusedopt.compat.v1 optimizer classes, Saver) or "keras" (fusedopt.keras optimizers,
model.save to .keras and keras.models.load_model).
PHASE: "start" trains steps [0, LAST) from scratch and saves; "resume" restores what
"start" saved and trains steps [FIRST, LAST). Either way every rule (with every option
set) is trained and the final values of all variables are written to OUT_NPZ.

Each step applies a dense update to a [6, 5] variable and a sparse update (duplicate
ids) to a [20, 4] embedding table; the beta powers are variables too (part of the
state a checkpoint has to carry). Gradients depend only on the step number.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import fusedopt.ops as fops  # noqa: E402

RULE_SETS = [("lazy_adam", {}), ("lazy_adam", {"use_nesterov": True}), ("adamax", {}),
             ("adagrad", {}), ("adagrad", {"epsilon_inside_sqrt": True})]
HYPER = {
    "lazy_adam": dict(lr=0.01, beta1=0.9, beta2=0.999, epsilon=1e-7),
    "adamax": dict(lr=0.02, beta1=0.8, beta2=0.95, epsilon=1e-7),
    "adagrad": dict(lr=0.1, epsilon=1e-7),
}
SHAPES = {"dense": (6, 5), "emb": (20, 4)}


def key(rule, options):
    return rule + "".join("-" + k for k, v in sorted(options.items()) if v)


def data(step):
    rng = np.random.default_rng(10_000 + step)
    dense_g = rng.normal(size=SHAPES["dense"]).astype(np.float32)
    idx = rng.integers(0, SHAPES["emb"][0], 9).astype(np.int64)  # duplicates likely
    emb_g = rng.normal(size=(9, SHAPES["emb"][1])).astype(np.float32)
    return dense_g, emb_g, idx


def initial_values(name):
    rng = np.random.default_rng(len(name) * 7919)
    return rng.uniform(-1, 1, SHAPES[name]).astype(np.float32)


def slot_init(rule, slot, shape):
    value = 0.1 if (rule == "adagrad" and slot == "accum") else 0.0
    return np.full(shape, value, np.float32)


class Model:
    """Variables and a step function for one (rule, options) in eager or graph mode."""

    def __init__(self, rule, options, graph):
        self.rule, self.options, self.graph = rule, options, graph
        self.hyper_names = fops.RULES[rule]["hyper"]
        mk = ((lambda x, n: tf.compat.v1.Variable(x, name=n, use_resource=False)) if graph
              else (lambda x, n: tf.Variable(x, name=n)))
        k = key(rule, options)
        self.vars = {}
        for name in SHAPES:
            self.vars[name] = mk(initial_values(name), "%s/%s" % (k, name))
            for s in fops.RULES[rule]["slots"]:
                self.vars[name + "/" + s] = mk(slot_init(rule, s, SHAPES[name]),
                                               "%s/%s/%s" % (k, name, s))
        self.powers = {}
        for p, beta in (("beta1_power", "beta1"), ("beta2_power", "beta2")):
            if p in self.hyper_names:
                self.powers[p] = (mk(np.float32(1.0), "%s/%s" % (k, p)), HYPER[rule][beta])

    def _update(self, dense_g, emb_g, idx):
        """Advances the beta powers, then updates both variables."""
        pre = [tf.compat.v1.assign(v, v * beta) if self.graph else v.assign(v * beta)
               for v, beta in self.powers.values()]
        with tf.control_dependencies(pre if self.graph else None):
            vals = dict(HYPER[self.rule])
            for p, (v, _) in self.powers.items():
                vals[p] = tf.identity(v) if self.graph else v.read_value()
            hyper = [vals[n] for n in self.hyper_names]
            slots = fops.RULES[self.rule]["slots"]
            prefix = "" if self.graph else "resource_"
            dense = getattr(fops, "%sapply_%s" % (prefix, self.rule))
            sparse = getattr(fops, "%ssparse_apply_%s" % (prefix, self.rule))
            a = dense(self.vars["dense"], *[self.vars["dense/" + s] for s in slots], *hyper,
                      dense_g, **self.options)
            b = sparse(self.vars["emb"], *[self.vars["emb/" + s] for s in slots], *hyper,
                       emb_g, idx, **self.options)
        if self.graph:
            return tf.group(a, b)
        return None

    def all_vars(self):
        return dict(self.vars, **{p: v for p, (v, _) in self.powers.items()})


def run_eager(phase, ckpt_dir, first, last):
    models = [Model(r, o, graph=False) for r, o in RULE_SETS]
    ckpt = tf.train.Checkpoint(**{"%s_%s" % (key(m.rule, m.options), n.replace("/", "_")): v
                                  for m in models for n, v in m.all_vars().items()})
    if phase == "resume":
        ckpt.read(os.path.join(ckpt_dir, "ckpt")).assert_consumed()
    for t in range(first if phase == "resume" else 0, last):
        dense_g, emb_g, idx = data(t)
        for m in models:
            m._update(tf.constant(dense_g), tf.constant(emb_g), tf.constant(idx))
    if phase == "start" and ckpt_dir:
        ckpt.write(os.path.join(ckpt_dir, "ckpt"))
    return {"%s/%s" % (key(m.rule, m.options), n): v.numpy()
            for m in models for n, v in m.all_vars().items()}


def run_graph(phase, ckpt_dir, first, last):
    with tf.Graph().as_default():
        models = [Model(r, o, graph=True) for r, o in RULE_SETS]
        dg = tf.compat.v1.placeholder(tf.float32, SHAPES["dense"])
        eg = tf.compat.v1.placeholder(tf.float32, [None, SHAPES["emb"][1]])
        ix = tf.compat.v1.placeholder(tf.int64, [None])
        train = tf.group(*[m._update(dg, eg, ix) for m in models])
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            if phase == "resume":
                saver.restore(sess, os.path.join(ckpt_dir, "model"))
            else:
                sess.run(tf.compat.v1.global_variables_initializer())
            for t in range(first if phase == "resume" else 0, last):
                dense_g, emb_g, idx = data(t)
                sess.run(train, {dg: dense_g, eg: emb_g, ix: idx})
            if phase == "start" and ckpt_dir:
                saver.save(sess, os.path.join(ckpt_dir, "model"))
            names = {"%s/%s" % (key(m.rule, m.options), n): v
                     for m in models for n, v in m.all_vars().items()}
            values = sess.run(names)
    return values


# --- the optimizer classes: fusedopt.compat.v1 (Saver) and fusedopt.keras (.keras) ----

def _opt_data(step, batch=12):
    rng = np.random.default_rng(20_000 + step)
    ids = rng.integers(0, 20, batch).astype(np.int64)
    return ids, rng.normal(size=(batch, 4)).astype(np.float32), rng.normal(
        size=(4, 3)).astype(np.float32)


def _v1_optimizers():
    from fusedopt.compat import v1
    return {"lazy_adam": lambda: v1.LazyAdamOptimizer(0.01),
            "adamax": lambda: v1.AdamaxOptimizer(0.02),
            "adagrad": lambda: v1.AdagradOptimizer(0.1)}


def run_v1_optimizer(phase, ckpt_dir, first, last):
    """tf.compat.v1 optimizer classes on ref variables: embedding (sparse) + dense."""
    with tf.Graph().as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        ge = tf.compat.v1.placeholder(tf.float32, [None, 4])
        gw = tf.compat.v1.placeholder(tf.float32, [4, 3])
        train, tracked = [], {}
        for name, make in sorted(_v1_optimizers().items()):
            with tf.compat.v1.variable_scope(name):
                emb = tf.compat.v1.Variable(initial_values("emb"), name="emb", use_resource=False)
                w = tf.compat.v1.Variable(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3),
                                          name="w", use_resource=False)
                loss = (tf.reduce_sum(tf.gather(emb, ids) * ge) + tf.reduce_sum(w * gw))
                opt = make()
                train.append(opt.minimize(loss, var_list=[emb, w]))
        saver = tf.compat.v1.train.Saver()
        for v in tf.compat.v1.global_variables():
            tracked[v.op.name] = v
        with tf.compat.v1.Session() as sess:
            if phase == "resume":
                saver.restore(sess, os.path.join(ckpt_dir, "v1opt"))
            else:
                sess.run(tf.compat.v1.global_variables_initializer())
            for t in range(first if phase == "resume" else 0, last):
                i, e, w_ = _opt_data(t)
                sess.run(train, {ids: i, ge: e, gw: w_})
            if phase == "start" and ckpt_dir:
                saver.save(sess, os.path.join(ckpt_dir, "v1opt"))
            return sess.run(tracked)


def _keras_model(rule):
    import fusedopt.keras as fk
    keras = tf.keras
    inp = keras.Input((3,), dtype="int64")
    x = keras.layers.Embedding(20, 4, name="emb")(inp)
    x = keras.layers.Flatten()(x)
    out = keras.layers.Dense(2, name="dense")(x)
    model = keras.Model(inp, out)
    opt = {"lazy_adam": lambda: fk.LazyAdam(0.01), "adamax": lambda: fk.Adamax(0.02),
           "adagrad": lambda: fk.Adagrad(0.1)}[rule]()
    model.compile(optimizer=opt, loss="mse")
    rng = np.random.default_rng(5)
    model.set_weights([w.astype(np.float32) for w in
                       (rng.uniform(-1, 1, (20, 4)), rng.uniform(-1, 1, (12, 2)),
                        rng.uniform(-1, 1, (2,)))])
    return model


def _keras_batch(step):
    rng = np.random.default_rng(30_000 + step)
    return (rng.integers(0, 20, (8, 3)).astype(np.int64),
            rng.normal(size=(8, 2)).astype(np.float32))


def run_keras(phase, ckpt_dir, first, last):
    """fusedopt.keras optimizers; model.save(.keras) / keras.models.load_model."""
    import fusedopt.keras  # noqa: F401 - registers the optimizers for load_model
    values = {}
    for rule in sorted(HYPER):
        path = os.path.join(ckpt_dir, rule + ".keras") if ckpt_dir else None
        if phase == "resume":
            model = tf.keras.models.load_model(path)
            assert type(model.optimizer).__module__.startswith("fusedopt"), model.optimizer
        else:
            model = _keras_model(rule)
        for t in range(first if phase == "resume" else 0, last):
            x, y = _keras_batch(t)
            model.train_on_batch(x, y)
        if phase == "start" and path:
            model.save(path)
        # By position: Keras 2 names optimizer variables differently after load_model.
        for i, v in enumerate(model.weights):
            values["%s/model/%d" % (rule, i)] = np.asarray(v.numpy())
        opt_vars = model.optimizer.variables
        opt_vars = opt_vars() if callable(opt_vars) else opt_vars
        for i, v in enumerate(opt_vars):
            values["%s/opt/%d" % (rule, i)] = np.asarray(v.numpy())
    return values


MODES = {"checkpoint": run_eager, "saver": run_graph, "v1optimizer": run_v1_optimizer,
         "keras": run_keras}


def run(mode, phase, ckpt_dir, first, last):
    return MODES[mode](phase, ckpt_dir, first, last)


if __name__ == "__main__":
    mode, phase, ckpt_dir, out, first, last = sys.argv[1:7]
    values = run(mode, phase, ckpt_dir, int(first), int(last))
    np.savez(out, **values)
