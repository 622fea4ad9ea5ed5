// Registers the LazyAdam ops (LazyAdamRule) and their CPU kernels (see kernels.h).
#include "cc/core/rules/lazy_adam.h"
#include "cc/tf/kernels.h"

FUSEDOPT_REGISTER_OPTIMIZER(LazyAdamRule);
