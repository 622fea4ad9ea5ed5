"""One module per update rule: its NumPy float64 oracle, written from docs/API_SPEC.md (no
code shared with the kernels or fusedopt.reference), and the parameters the tests use
for it. numpy_reference.py collects every module here; a test of "every rule" runs over
them, and test_registry.py checks they are exactly the rules of the C++ registry.

Each module defines:
    SLOTS, HYPER, OPTIONS   the rule's slot names, hyper-parameter names (op order) and
                            option defaults, as the spec documents them
    update(var, slots, g, h, o) -> (var, [slots])   one dense step, float64
    OPTION_SETS             option combinations worth testing (defaults first)
    BASE_HYPER              hyper-parameters (large enough to matter at half precision)
    POWERS                  {hyper: base}: filled per step as BASE_HYPER[base] ** step
    SLOT_RANGES             {slot: (low, high)} of random initial values
    KERAS_KWARGS, LEGACY_KWARGS   arguments the front-end tests add to every constructor
    COMPAT_V1_KWARGS        the compat.v1 class's constructor arguments in its tests
    ANCHOR_CASES            [(options, hyper overrides, sparse)] run against tf_anchor
    tf_anchor(tf, handles, h, grad, options, indices)   TF's own op with the same math
"""
