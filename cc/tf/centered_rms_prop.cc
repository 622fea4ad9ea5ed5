// Registers the CenteredRMSProp ops and their kernels (see kernels.h).
#include "cc/core/rules/rms_prop.h"
#include "cc/tf/kernels.h"

FUSEDOPT_REGISTER_OPTIMIZER(CenteredRmsPropRule);
