// Registers the LazyAdam ops (AdamRule) and their CPU kernels (see kernels.h).
#include "cc/core/rules/adam.h"
#include "cc/tf/kernels.h"

FUSEDOPT_REGISTER_OPTIMIZER(AdamRule);
