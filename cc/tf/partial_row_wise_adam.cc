// Registers the partial row-wise Adam ops and their CPU kernels (see kernels.h).
#include "cc/core/rules/partial_row_wise_adam.h"
#include "cc/tf/kernels.h"

FUSEDOPT_REGISTER_OPTIMIZER(PartialRowWiseAdamRule);
