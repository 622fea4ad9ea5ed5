// Registers the Adamax ops and their CPU kernels (see kernels.h).
#include "cc/core/rules/adamax.h"
#include "cc/tf/kernels.h"

FUSEDOPT_REGISTER_OPTIMIZER(AdamaxRule);
