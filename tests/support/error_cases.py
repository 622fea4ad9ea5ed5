"""Bad-input cases shared by test_errors.py (TF ops) and test_core.py (fusedopt._core).

Each Case holds float32 arrays for var/slots/hyper/grad/indices and the regex of the
message docs/API_SPEC.md prescribes (the same text from the TF kernels and _core).
"""

import re
import zlib

import numpy as np

import harness
import numpy_reference as npref

RULES = npref.RULES
RULE_NAMES = sorted(RULES)


def _shape(s):
    return "[" + ",".join(str(d) for d in s) + "]"


def _either_order(a, b):
    a, b = re.escape(_shape(a)), re.escape(_shape(b))
    return "(%s vs %s|%s vs %s)" % (a, b, b, a)


class Case:
    """Inputs for one bad call: var/slot/hyper/grad/indices arrays and the message."""

    def __init__(self, cid, rule, sparse, message, var_shape=None, slot_shapes=None,
                 hyper_shapes=None, grad_shape=None, indices=None, index_dtype=np.int32):
        self.id, self.rule, self.sparse, self.message = cid, rule, sparse, message
        rng = np.random.default_rng(zlib.crc32(cid.encode()))
        spec = RULES[rule]
        var_shape = var_shape if var_shape is not None else ((5, 2) if sparse else (3, 2))
        slot_shapes = dict(slot_shapes or {})
        self.var = rng.uniform(-1, 1, var_shape).astype(np.float32)
        self.slots = [rng.uniform(0.1, 1, slot_shapes.get(
            n, npref.slot_shape(rule, n, var_shape))).astype(np.float32) for n in spec["slots"]]
        hyper = harness.hyper_for(rule, "float", 1)
        self.hyper = {k: np.full((hyper_shapes or {}).get(k, ()), v, np.float32)
                      for k, v in hyper.items()}
        if sparse:
            self.indices = np.asarray([0, 2, 1] if indices is None else indices, index_dtype)
            grad_shape = grad_shape if grad_shape is not None else (
                self.indices.shape[:1] + tuple(var_shape[1:]))
        else:
            self.indices = None
            grad_shape = grad_shape if grad_shape is not None else var_shape
        self.grad = rng.uniform(-1, 1, grad_shape).astype(np.float32)

    def args(self, var, slots, hyper, grad, indices):
        args = [var] + list(slots) + [hyper[h] for h in RULES[self.rule]["hyper"]] + [grad]
        return args + ([indices] if self.sparse else [])

    def state(self):
        return [self.var] + self.slots

    def __repr__(self):
        return self.id


def _cases():
    cases = []
    for rule in RULE_NAMES:
        spec = RULES[rule]
        for sparse in (False, True):
            kind = "sparse" if sparse else "dense"
            vshape = (5, 2) if sparse else (3, 2)
            for slot in spec["slots"]:
                if spec["slot_layouts"][slot] == "per_row":
                    # the kernels name var.shape[:1]; graph construction its value only
                    message = (re.escape("%s holds one value per row of var: shape " % slot)
                               + "(var\\.shape\\[:1\\] = )?" + re.escape(
                                   "%s, got %s (var %s)" % (_shape(vshape[:1]), _shape(vshape),
                                                            _shape(vshape))))
                    bad = vshape
                else:
                    bad = (vshape[0],)
                    message = (re.escape("%s must have the same shape as var: " % slot)
                               + _either_order(vshape, bad))
                cases.append(Case("%s-%s-slot_%s_shape" % (rule, kind, slot), rule, sparse,
                                  message, slot_shapes={slot: bad}))
            for h in spec["hyper"]:
                cases.append(Case(
                    "%s-%s-hyper_%s_not_scalar" % (rule, kind, h), rule, sparse,
                    re.escape("%s must be a scalar, got shape [2]" % h),
                    hyper_shapes={h: (2,)}))
        cases.append(Case(
            "%s-dense-grad_shape" % rule, rule, False,
            re.escape("grad must have the same shape as var: ") + _either_order((3, 2), (3, 3)),
            grad_shape=(3, 3)))
        sp = lambda cid, msg, **kw: cases.append(  # noqa: E731
            Case("%s-sparse-%s" % (rule, cid), rule, True, msg, **kw))
        sp("var_rank0", re.escape("var must be at least 1-D, got shape []"),
           var_shape=(), grad_shape=(1,), indices=[0])
        sp("indices_rank2", re.escape("indices must be 1-D, got shape [2,2]"),
           indices=[[0, 1], [2, 3]], grad_shape=(2, 2))
        sp("grad_rank", re.escape("grad must have shape [N] + var.shape[1:] = [3,2], got [3]"),
           grad_shape=(3,))
        sp("grad_inner", re.escape(
            "grad must have shape [N] + var.shape[1:] = [3,2], got [3,4]"), grad_shape=(3, 4))
        sp("grad_rank3", re.escape(
            "grad must have shape [N] + var.shape[1:] = [3,2], got [3,2,1]"),
           grad_shape=(3, 2, 1))
        sp("first_dim", re.escape("grad and indices must have the same first dimension: 3 vs 4"),
           grad_shape=(3, 2), indices=[0, 1, 2, 3])
        sp("negative_index", re.escape("indices[1] = -1 is not in [0, 5)"), indices=[0, -1, 2])
        sp("index_eq_rows", re.escape("indices[1] = 5 is not in [0, 5)"), indices=[1, 5, 7])
        # Offending index after valid (and duplicate) ones: nothing may be written.
        sp("index_after_valid", re.escape("indices[6] = 9 is not in [0, 5)"),
           indices=[0, 1, 2, 3, 1, 0, 9, 4])
        sp("index_int64_huge", re.escape("indices[2] = 1099511627776 is not in [0, 5)"),
           indices=[4, 4, 2**40], index_dtype=np.int64)
        sp("index_int32_min", re.escape("indices[0] = -2147483648 is not in [0, 5)"),
           indices=[-2**31, 3], index_dtype=np.int32)
        sp("index_into_empty_var", re.escape("indices[0] = 0 is not in [0, 0)"),
           var_shape=(0, 2), indices=[0])
    return cases


CASES = _cases()
CASE_IDS = [c.id for c in CASES]


def problem(case):
    """The error class of a case, e.g. 'first_dim' or 'slot_m_shape'."""
    return case.id.split("-", 2)[2]
