//===- Passes.h - spectra passes and pipelines ---------------------------===//

#ifndef SPECTRA_PASSES_PASSES_H
#define SPECTRA_PASSES_PASSES_H

#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassManager.h"

#include "dialect/SpectraDialect.h"

namespace mlir::spectra {

#define GEN_PASS_DECL
#include "passes/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

/// Differentiates the features region of `component` and inserts the
/// spectra.feature_partials op after it (see -spectra-derive-partials).
/// Emits a diagnostic naming the op it cannot differentiate on failure.
FailureOr<FeaturePartialsOp> derivePartials(ComponentOp component);

/// The local derivative of `op`'s result with respect to its operand `operand`, built at
/// b's insertion point from the op's own operands and result (the forward-mode rule of
/// -spectra-derive-partials seeded with 1): a null Value where it is zero, failure for an
/// op outside the rules. On scalars (f32) or, elementwise, on vectors of f32.
FailureOr<Value> localPartial(OpBuilder &b, Location loc, Operation *op, unsigned operand);

/// The input pipeline: link the built-in library, then canonicalise the
/// recipes (folds next_pow2 of constants). Registered in spectra-opt as
/// `spectra-input-pipeline` and run by spectra-compile for --emit=spectra.
void buildSpectraInputPipeline(OpPassManager &pm);

/// Registers every spectra pass and pipeline (for spectra-opt).
void registerSpectraPassesAndPipelines();

} // namespace mlir::spectra

#endif // SPECTRA_PASSES_PASSES_H
