"""Convergence of the compact-state rules on a synthetic click-through problem:
does row-wise Adagrad (partial row-wise Adam, bf16 slots) reach the held-out log-loss of
its full-state float32 counterpart after the same steps?

The problem: one embedding table, ``features`` Zipf(1.1)-distributed ids per example (a
random permutation of the rows per feature), labels drawn from a hidden logistic model
(per-row weights, per-row 4-vectors whose dot products between an example's features add
pairwise interactions, Gaussian noise on the logit). The model: the example's embeddings
concatenated, one ReLU layer, one logit, binary cross-entropy. Every run starts from the
same weights and sees the same batches in the same order; only the optimizer of the
embedding table changes (the tower always has ``keras.optimizers.Adam``). Learning rates
are fixed per family (Adagrad's, Adam's), the same for the full-state rule and its
compact variant. Reported: held-out log-loss after a few points and at the end, and each
variant's relative difference from its counterpart's (positive: worse).
"""
import time

import numpy as np

from fusedopt.bench.config import embedding_sizes
from fusedopt.bench.sparse import zipf_ids
from fusedopt.bench.state import BF16, Contender, Unavailable

# Fixed before any run (not tuned on the variants): FBGEMM/TorchRec's initial accumulator
# (0; Keras's 0.1 would dwarf mean-loss gradients of ~1e-3), Adam at twice Keras's default.
ADAGRAD = {"learning_rate": 0.05, "initial_accumulator_value": 0.0}
ADAM = {"learning_rate": 0.002}
TOWER_LR = 1e-3

RUNS = (
    Contender("fusedopt.keras.Adagrad", "fusedopt.keras", "Adagrad", ADAGRAD),
    Contender("fusedopt.keras.RowWiseAdagrad", "fusedopt.keras", "RowWiseAdagrad", ADAGRAD),
    Contender("fusedopt.keras.LazyAdam", "fusedopt.keras", "LazyAdam", ADAM),
    Contender("fusedopt.keras.PartialRowWiseAdam", "fusedopt.keras", "PartialRowWiseAdam", ADAM),
    Contender("fusedopt.keras.LazyAdam, bf16 slots", "fusedopt.keras", "LazyAdam",
              {**ADAM, **BF16}),
    Contender("fusedopt.keras.LazyAdam, bf16 slots, stochastic rounding", "fusedopt.keras",
              "LazyAdam", {**ADAM, **BF16, "stochastic_rounding": True}),
    Contender("fusedopt.keras.Adagrad, bf16 slots", "fusedopt.keras", "Adagrad",
              {**ADAGRAD, **BF16}),
    Contender("fusedopt.keras.Adagrad, bf16 slots, stochastic rounding", "fusedopt.keras",
              "Adagrad", {**ADAGRAD, **BF16, "stochastic_rounding": True}),
)
# (variant, its full-state float32 counterpart): labels of RUNS. The aim: the variant's
# held-out log-loss at most this much (%) above its counterpart's (below is fine too).
PAIRS_WITHIN_PCT = 1
PAIRS = (("fusedopt.keras.RowWiseAdagrad", "fusedopt.keras.Adagrad"),
         ("fusedopt.keras.PartialRowWiseAdam", "fusedopt.keras.LazyAdam"),
         ("fusedopt.keras.LazyAdam, bf16 slots", "fusedopt.keras.LazyAdam"),
         ("fusedopt.keras.LazyAdam, bf16 slots, stochastic rounding", "fusedopt.keras.LazyAdam"),
         ("fusedopt.keras.Adagrad, bf16 slots", "fusedopt.keras.Adagrad"),
         ("fusedopt.keras.Adagrad, bf16 slots, stochastic rounding", "fusedopt.keras.Adagrad"))

INTERACTION_DIM, NOISE, BIAS = 4, 0.5, -1.2


def log_loss(logits, labels):
    """Mean binary cross-entropy of logits, in float64."""
    z = np.asarray(logits, np.float64)
    return float(np.mean(np.logaddexp(0.0, z) - labels * z))


class CtrProblem:
    """The data (training batches, held-out set) and the initial model weights."""

    def __init__(self, cfg, seed=0):
        rng = np.random.default_rng(seed)
        rows, self.cfg = cfg["rows"], cfg
        self.first_order = rng.normal(0, 0.6, rows)
        self.vectors = rng.normal(0, 0.5, (rows, INTERACTION_DIM))
        self.permutations = [rng.permutation(rows) for _ in range(cfg["features"])]
        n = cfg["steps"] * cfg["batch"]
        ids, self.train_labels, _ = self.examples(rng, n)
        self.train_ids = ids.reshape(cfg["steps"], cfg["batch"], cfg["features"])
        self.train_labels = self.train_labels.reshape(cfg["steps"], cfg["batch"], 1)
        self.held_out_ids, self.held_out_labels, hidden = self.examples(rng, cfg["held_out"])
        self.hidden_log_loss = log_loss(hidden, self.held_out_labels)
        def glorot(fan_in, fan_out):
            return rng.uniform(-1, 1, (fan_in, fan_out)) * np.sqrt(6 / (fan_in + fan_out))

        self.init = [rng.normal(0, 0.05, (rows, cfg["dim"])),
                     glorot(cfg["features"] * cfg["dim"], cfg["hidden"]), np.zeros(cfg["hidden"]),
                     glorot(cfg["hidden"], 1), np.zeros(1)]

    def examples(self, rng, n, chunk=1 << 20):
        """(ids [n, features] int32, labels [n] float32, the hidden noise-free logits),
        made `chunk` examples at a time (the interaction vectors: 128 bytes an example)."""
        parts = [self._examples(rng, min(chunk, n - i)) for i in range(0, n, chunk)]
        return tuple(np.concatenate(p) for p in zip(*parts))

    def _examples(self, rng, n):
        rows = self.cfg["rows"]
        ids = np.stack([p[zipf_ids(rng, rows, n)] for p in self.permutations], 1)
        logit = BIAS + self.first_order[ids].sum(1)
        vectors = self.vectors[ids]
        for f in range(ids.shape[1]):
            for g in range(f + 1, ids.shape[1]):
                logit += np.sum(vectors[:, f] * vectors[:, g], 1)
        noisy = logit + rng.normal(0, NOISE, n)
        labels = (rng.random(n) < 1 / (1 + np.exp(-noisy))).astype(np.float32)
        return ids.astype(np.int32), labels, logit


class CtrModel:
    """The model's variables from the problem's initial weights, and its logits."""

    def __init__(self, tf, problem):
        self.tf, self.cfg = tf, problem.cfg
        self.table, *self.tower = [tf.Variable(w.astype(np.float32)) for w in problem.init]

    def logits(self, ids):
        tf, cfg = self.tf, self.cfg
        w1, b1, w2, b2 = self.tower
        x = tf.reshape(tf.gather(self.table, ids), [-1, cfg["features"] * cfg["dim"]])
        return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2

    def held_out_log_loss(self, problem, chunk=8192):
        ids = problem.held_out_ids
        logits = np.concatenate([self.logits(ids[i:i + chunk]).numpy()[:, 0]
                                 for i in range(0, len(ids), chunk)])
        return log_loss(logits, problem.held_out_labels)


def train(tf, problem, contender):
    """One run: {held_out_log_loss, curve [[step, loss]], seconds}."""
    cfg = problem.cfg
    model = CtrModel(tf, problem)
    table_optimizer = contender.make()
    tower_optimizer = tf.keras.optimizers.Adam(TOWER_LR)

    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
                labels, model.logits(ids)))
        grads = tape.gradient(loss, [model.table] + model.tower)
        table_optimizer.apply_gradients([(grads[0], model.table)])
        tower_optimizer.apply_gradients(zip(grads[1:], model.tower))
        return loss

    every = cfg["steps"] // cfg["evals"]
    curve = [[0, model.held_out_log_loss(problem)]]
    start = time.perf_counter()
    for s in range(cfg["steps"]):
        step(problem.train_ids[s], problem.train_labels[s])
        if (s + 1) % every == 0 or s + 1 == cfg["steps"]:
            curve.append([s + 1, model.held_out_log_loss(problem)])
    seconds = time.perf_counter() - start
    state_dtypes = sorted({tf.as_dtype(v.dtype).name for v in table_optimizer.variables
                           if len(v.shape)})
    return {"held_out_log_loss": curve[-1][1], "curve": curve, "seconds": seconds,
            "slot_dtypes": state_dtypes}


def scenario_convergence(tf, progress, quick):
    """{"_meta", "runs": {label: run}, "pairs": [{variant, counterpart, rel_diff_pct}]}."""
    cfg = embedding_sizes(quick)["convergence"]
    problem = CtrProblem(cfg)
    out = {"_meta": {**cfg, "zipf_a": 1.1, "tower_optimizer": f"keras.optimizers.Adam({TOWER_LR})",
                     "hidden_model_log_loss": problem.hidden_log_loss,
                     "held_out_positive_rate": float(problem.held_out_labels.mean())},
           "runs": {}, "pairs": []}
    progress(f"convergence: {cfg['rows']:,} x {cfg['dim']} table, {cfg['steps']:,} steps of "
             f"{cfg['batch']:,}; hidden model's held-out log-loss {problem.hidden_log_loss:.4f}")
    for contender in RUNS:
        run = {"class": f"{contender.module}.{contender.name}", "kwargs": contender.kwargs}
        try:
            run.update(train(tf, problem, contender))
            progress(f"convergence: {contender.label}: held-out log-loss "
                     f"{run['held_out_log_loss']:.5f} ({run['seconds']:.0f} s)")
        except Unavailable as e:
            run["not_available"] = str(e)
            progress(f"convergence: {contender.label}: not available ({e})")
        out["runs"][contender.label] = run
    for variant, counterpart in PAIRS:
        ours, theirs = out["runs"][variant], out["runs"][counterpart]
        if "held_out_log_loss" in ours and "held_out_log_loss" in theirs:
            a, b = ours["held_out_log_loss"], theirs["held_out_log_loss"]
            out["pairs"].append({
                "variant": variant, "counterpart": counterpart, "rel_diff_pct": 100 * (a - b) / b,
                "rel_diff_pct_curve": [[step, 100 * (x - y) / y] for (step, x), (_, y)
                                       in zip(ours["curve"][1:], theirs["curve"][1:])],
                # the same difference against what training can still gain
                "of_excess_over_hidden_pct": 100 * (a - b) / (b - problem.hidden_log_loss)})
        else:
            out["pairs"].append({"variant": variant, "counterpart": counterpart,
                                 "rel_diff_pct": None})
    return out
