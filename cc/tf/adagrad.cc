// Registers the Adagrad ops and their CPU kernels (see kernels.h).
#include "cc/core/rules/adagrad.h"
#include "cc/tf/kernels.h"

FUSEDOPT_REGISTER_OPTIMIZER(AdagradRule);
