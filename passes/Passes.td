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

#endif // SPECTRA_PASSES_PASSES_TD
