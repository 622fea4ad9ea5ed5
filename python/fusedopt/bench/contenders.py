"""Who fusedopt is measured against, per rule: the benchmark's one table keyed by rule.

The scenarios (``sparse.py``, ``dense.py``) know how to build and run each kind of
contender; which contenders exist for a rule, and with which hyper-parameters, is written
here only. A contender's ``semantics`` names the fusedopt run whose numbers it must
reproduce (its oracle; the scenario modules define them):

- sparse scenario: "lazy" (fusedopt's sparse op, only touched rows change), "dense" (its
  dense op on the densified gradient: every row's slots decay), "lazy_eps_out" (the sparse
  op in TF's form, without ``keras_options``);
- dense scenario: "tf" (fusedopt's dense op in TF's form), "keras" (with
  ``keras_options``), "torch" (with ``torch_hyper``).
"""
import functools
from typing import Callable, NamedTuple, Optional

from fusedopt.bench import libraries
from fusedopt.bench.config import BETA1, BETA2, EPS, LR


class Optimizer(NamedTuple):
    """An optimizer object run as a contender (another library's, or a fusedopt front end)."""
    name: str  # its row in the report
    semantics: str  # its oracle (see the module doc)
    library: Callable  # () -> the module `make` needs, None where it is not installed
    make: Callable  # (module) -> optimizer; torch's: (module, parameters) -> optimizer
    # Its sparse update is the rule's lazy update in composed TF ops (gather, compute,
    # scatter): a candidate for the sparse scenario's plain-TF anchor (fastest_composition).
    composed: bool = False


class RuleContenders(NamedTuple):
    """What the benchmark runs for one fusedopt rule."""
    slots: tuple  # slot names, as TF's own kernels name their inputs
    slot_init: float
    hyper: Callable  # step t (float or tensor) -> the op's hyper-parameters at step t
    # tf.keras's optimizer (sparse, dense "tf.keras (composed)", XLA) and the tf.raw_ops
    # name of TF's own fused dense kernel: None for a rule neither has.
    keras: Optional[Optimizer]
    tf_dense_kernel: Optional[str]
    keras_options: dict = {}  # fusedopt op options that give tf.keras's numbers
    tf_sparse_kernel: Optional[str] = None  # TF's fused sparse kernel (needs unique ids)
    sparse_optimizers: tuple = ()  # further optimizer contenders of the sparse scenario
    fusedopt_keras: Optional[Optimizer] = None  # fusedopt's Keras class: sparse, XLA
    torch_sparse: Optional[Optimizer] = None  # make(torch, parameters); sparse grads
    torch_dense: tuple = ()  # Optimizers, make(torch, parameters); dense grads
    torch_hyper: Optional[Callable] = None  # `hyper` in torch's form (oracle "torch")
    per_row: tuple = ()  # the slots with one value per row (shape var.shape[:1])
    # tf.keras's sparse path fails on repeated ids (Keras 3's centered RMSprop: its index
    # union counts a repeated id twice and gathers out of range): fed summed unique rows.
    keras_sparse_dedup: bool = False

    def slot_shape(self, slot, var_shape):
        """The shape of slot `slot` (its name) beside a var of `var_shape`."""
        return tuple(var_shape)[:1] if slot in self.per_row else tuple(var_shape)

    def tf_kernel_variables(self, var, slots):
        """The variable inputs of TF's own kernels (tf.raw_ops), by their names."""
        return {"var": var.handle, **{name: slot.handle for name, slot in zip(self.slots, slots)}}


# The sparse scenario's own composition of each rule's lazy update in TF ops (sparse.py).
COMPOSED_TF_OPS = "composed TF ops (tensorflow-addons style)"
# What results recorded before it hold instead: fusedopt.reference's composition (the tests'
# oracle), several times slower than COMPOSED_TF_OPS.
ORACLE_COMPOSITION = "composed gather/scatter"


def compositions(rule):
    """The names of `rule`'s sparse contenders that run its lazy update in composed TF ops."""
    entry = RULES.get(rule)
    optimizers = (entry.keras, *entry.sparse_optimizers) if entry else ()
    return (COMPOSED_TF_OPS, ORACLE_COMPOSITION) + tuple(
        optimizer.name for optimizer in optimizers if optimizer and optimizer.composed)


def fastest_composition(rule, rows):
    """(name, row) of the fastest composition (``compositions``) in a sparse table's rows
    ({contender: row}): the anchor "the same update in plain TF ops"; None if none ran."""
    present = [name for name in compositions(rule) if name in rows]
    if not present:
        return None
    name = min(present, key=lambda name: rows[name]["median_ms"])
    return name, rows[name]


def add_optimizer(contenders, entry, build, suffix=""):
    """contenders[entry.name + suffix] = (make, semantics) where there is such an entry and
    its library is installed; make = build(make_optimizer[, batches]) -> (step, variable)."""
    module = entry and entry.library()
    if module is not None:
        make_optimizer = functools.partial(entry.make, module)
        contenders[entry.name + suffix] = (functools.partial(build, make_optimizer),
                                           entry.semantics)


def adam_hyper(t):
    return dict(beta1_power=BETA1 ** t, beta2_power=BETA2 ** t, lr=LR, beta1=BETA1,
                beta2=BETA2, epsilon=EPS)


def adam_torch_hyper(t):
    # torch adds epsilon after bias-correcting sqrt(v): the same update as ours with
    # epsilon * sqrt(1 - beta2^t).
    return dict(adam_hyper(t), epsilon=EPS * (1 - BETA2 ** t) ** 0.5)


def adamax_hyper(t):
    return dict(beta1_power=BETA1 ** t, lr=LR, beta1=BETA1, beta2=BETA2, epsilon=EPS)


def adagrad_hyper(t):
    return dict(lr=LR, epsilon=EPS)


RMS_RHO, RMS_MOMENTUM = 0.9, 0.9


def rms_prop_hyper(t):
    return dict(lr=LR, rho=RMS_RHO, momentum=RMS_MOMENTUM, epsilon=EPS)


def _torch_adam(variant):
    return Optimizer(f"torch Adam ({variant})", "torch", libraries.torch,
                     lambda torch, parameters: torch.optim.Adam(
                         parameters, lr=LR, betas=(BETA1, BETA2), eps=EPS, **{variant: True}))


ADAGRAD_INITIAL_ACCUMULATOR = 0.1

RULES = {
    "lazy_adam": RuleContenders(
        slots=("m", "v"), slot_init=0.0, hyper=adam_hyper,
        keras=Optimizer("tf.keras Adam", "dense", libraries.tensorflow,
                        lambda tf: tf.keras.optimizers.Adam(LR, BETA1, BETA2, EPS)),
        tf_dense_kernel="ResourceApplyAdam",
        sparse_optimizers=(
            Optimizer("tf.compat.v1 AdamOptimizer", "dense", libraries.tensorflow,
                      lambda tf: tf.compat.v1.train.AdamOptimizer(LR, BETA1, BETA2, EPS)),
            Optimizer("tf_keras legacy Adam", "dense", libraries.tf_keras,
                      lambda tf_keras: tf_keras.optimizers.legacy.Adam(LR, BETA1, BETA2, EPS)),
            # fusedopt's Adam with Keras's sparse semantics (every row): one fused pass.
            Optimizer("fusedopt.keras.Adam (every row)", "dense", libraries.fusedopt_keras,
                      lambda fk: fk.Adam(LR, BETA1, BETA2, EPS)),
            # The real thing (TF <= 2.15): a Keras 2 legacy optimizer with lazy rows.
            Optimizer("tensorflow_addons LazyAdam", "lazy", libraries.tensorflow_addons,
                      lambda tfa: tfa.optimizers.LazyAdam(LR, BETA1, BETA2, EPS),
                      composed=True)),
        fusedopt_keras=Optimizer("fusedopt.keras.LazyAdam", "lazy", libraries.fusedopt_keras,
                                 lambda fk: fk.LazyAdam(LR, BETA1, BETA2, EPS)),
        torch_sparse=Optimizer("torch SparseAdam", "lazy", libraries.torch,
                               lambda torch, parameters: torch.optim.SparseAdam(
                                   parameters, lr=LR, betas=(BETA1, BETA2), eps=EPS)),
        torch_dense=(_torch_adam("foreach"), _torch_adam("fused")),
        torch_hyper=adam_torch_hyper),
    "adamax": RuleContenders(
        slots=("m", "v"), slot_init=0.0, hyper=adamax_hyper,
        keras=Optimizer("tf.keras Adamax", "dense", libraries.tensorflow,
                        lambda tf: tf.keras.optimizers.Adamax(LR, BETA1, BETA2, EPS)),
        tf_dense_kernel="ResourceApplyAdaMax"),
    "adagrad": RuleContenders(
        slots=("accum",), slot_init=ADAGRAD_INITIAL_ACCUMULATOR, hyper=adagrad_hyper,
        # Keras's Adagrad leaves rows without gradient as they are: lazy by nature.
        keras=Optimizer("tf.keras Adagrad", "lazy", libraries.tensorflow,
                        lambda tf: tf.keras.optimizers.Adagrad(
                            LR, initial_accumulator_value=ADAGRAD_INITIAL_ACCUMULATOR,
                            epsilon=EPS), composed=True),
        # TF's kernels (and fusedopt's default) add epsilon outside the sqrt, Keras inside.
        keras_options={"epsilon_inside_sqrt": True},
        tf_dense_kernel="ResourceApplyAdagradV2",
        tf_sparse_kernel="ResourceSparseApplyAdagradV2"),
    # FBGEMM's EXACT_ROWWISE_ADAGRAD; no TF or Keras class (FBGEMM CPU as a peer: issue 33).
    "row_wise_adagrad": RuleContenders(
        slots=("accum",), slot_init=ADAGRAD_INITIAL_ACCUMULATOR, hyper=adagrad_hyper,
        keras=None, tf_dense_kernel=None, per_row=("accum",),
        fusedopt_keras=Optimizer("fusedopt.keras.RowWiseAdagrad", "lazy",
                                 libraries.fusedopt_keras,
                                 lambda fk: fk.RowWiseAdagrad(
                                     LR, initial_accumulator_value=ADAGRAD_INITIAL_ACCUMULATOR,
                                     epsilon=EPS))),
    # FBGEMM's PARTIAL_ROWWISE_ADAM (GPU only there); no TF or Keras class.
    "partial_row_wise_adam": RuleContenders(
        slots=("m", "v"), slot_init=0.0, hyper=adam_hyper,
        keras=None, tf_dense_kernel=None, per_row=("v",),
        fusedopt_keras=Optimizer("fusedopt.keras.PartialRowWiseAdam", "lazy",
                                 libraries.fusedopt_keras,
                                 lambda fk: fk.PartialRowWiseAdam(LR, BETA1, BETA2, EPS))),
    "rms_prop": RuleContenders(
        slots=("ms", "mom"), slot_init=0.0, hyper=rms_prop_hyper,
        keras=Optimizer("tf.keras RMSprop", "dense", libraries.tensorflow,
                        lambda tf: tf.keras.optimizers.RMSprop(LR, RMS_RHO, RMS_MOMENTUM, EPS)),
        tf_dense_kernel="ResourceApplyRMSProp",
        tf_sparse_kernel="ResourceSparseApplyRMSProp",
        fusedopt_keras=Optimizer("fusedopt.keras.RMSprop", "lazy", libraries.fusedopt_keras,
                                 lambda fk: fk.RMSprop(LR, RMS_RHO, RMS_MOMENTUM, EPS))),
    "centered_rms_prop": RuleContenders(
        slots=("ms", "mom", "mg"), slot_init=0.0, hyper=rms_prop_hyper,
        keras=Optimizer("tf.keras RMSprop (centered)", "dense", libraries.tensorflow,
                        lambda tf: tf.keras.optimizers.RMSprop(LR, RMS_RHO, RMS_MOMENTUM, EPS,
                                                               centered=True)),
        tf_dense_kernel="ResourceApplyCenteredRMSProp",
        tf_sparse_kernel="ResourceSparseApplyCenteredRMSProp",
        keras_sparse_dedup=True,
        fusedopt_keras=Optimizer("fusedopt.keras.RMSprop (centered)", "lazy",
                                 libraries.fusedopt_keras,
                                 lambda fk: fk.RMSprop(LR, RMS_RHO, RMS_MOMENTUM, EPS,
                                                       centered=True))),
}
