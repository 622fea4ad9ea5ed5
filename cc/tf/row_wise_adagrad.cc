// Registers the row-wise Adagrad ops and their CPU kernels (see kernels.h).
#include "cc/core/rules/row_wise_adagrad.h"
#include "cc/tf/kernels.h"

FUSEDOPT_REGISTER_OPTIMIZER(RowWiseAdagradRule);
