//===- SpectraOps.td - all spectra ops -----------------------------------===//

#ifndef SPECTRA_DIALECT_SPECTRAOPS_TD
#define SPECTRA_DIALECT_SPECTRAOPS_TD

include "dialect/WeightOps.td"
include "dialect/ComponentOps.td"
include "dialect/AttentionOps.td"
include "dialect/DerivativeOps.td"

#endif // SPECTRA_DIALECT_SPECTRAOPS_TD
