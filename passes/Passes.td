//===- Passes.td - spectra passes ----------------------------------------===//

#ifndef SPECTRA_PASSES_PASSES_TD
#define SPECTRA_PASSES_PASSES_TD

include "mlir/Pass/PassBase.td"

def SpectraLinkLibrary : Pass<"spectra-link-library", "::mlir::ModuleOp"> {
  let summary = "copy the built-in recipes and components that feature maps reference";
  let description = [{
    A module may reference the built-in library by name
    (`spectra.feature_map @f component @posrf weights @orf ...`) without
    defining `@posrf` or `@orf`. This pass copies every such definition from
    the embedded library into the module; definitions the module already has
    win, so a user can override a built-in. A name found nowhere is an error
    on the feature map.

    ```mlir
    // Before: only the feature map.
    spectra.feature_map @posrf_base component @posrf weights @base m = 64 d = 16 seed = 0
    // After: spectra.weight_recipe @base {...} and spectra.component @posrf {...} precede it.
    ```
  }];
  let dependentDialects = ["::mlir::spectra::SpectraDialect", "::mlir::arith::ArithDialect",
                           "::mlir::math::MathDialect"];
}

def SpectraDerivePartials : Pass<"spectra-derive-partials", "::mlir::ModuleOp"> {
  let summary = "differentiate every component's features region (forward mode)";
  let description = [{
    For each `spectra.component @c` without one, adds
    `spectra.feature_partials @c_partials of @c` holding d logit / d v and
    d coeff / d v for every output and every argument v (wx, xx, ww, the
    scalar parameters). The backward kernels chain these with
    d wx / d x = w, d xx / d x = 2x, d wx / d w = x, d ww / d w = 2w. Fails
    with the op it cannot differentiate (the supported set is that of the
    runtime's interpreter). Follow with -canonicalize -cse to fold zeros.

    ```mlir
    // features: l = wx - 0.5 * xx, yield exp(l) scaled(c)
    // partials: dl/dwx = 1, dl/dxx = -0.5, dl/dww = 0, dl/dc = 0, dc/dc = 1, ...
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
}

#endif // SPECTRA_PASSES_PASSES_TD
