//===- DerivativeOps.td - derivatives of component functions -------------===//
//
// The backward kernels need, per feature, the partial derivatives of every
// output's logit and coefficient with respect to the per-feature scalars
// (wx, xx, ww) and the scalar parameters. spectra-derive-partials produces
// them by differentiating the features region, so a user-declared component
// gets its backward without a hand-written derivative.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_DIALECT_DERIVATIVEOPS_TD
#define SPECTRA_DIALECT_DERIVATIVEOPS_TD

include "dialect/SpectraBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Spectra_FeaturePartialsOp : Spectra_Op<"feature_partials", [
    Symbol, IsolatedFromAbove, SingleBlock,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmBlockArgumentNames"]>]> {
  let summary = "partial derivatives of a component's logits and coefficients";
  let description = [{
    The body takes the same arguments as the `features` region of
    `component` (wx, xx, ww, then the scalar parameters) and yields, for each
    output o and each argument v in order, the pair
    `(d logit_o / d v, d coeff_o / d v)`: 2 * outputs * (3 + parameters) values.

    Constraints:
    * C1: `component` names a `spectra.component` of the module.
    * C2: the body has as many `f32` arguments as the component's features region.
    * C3: the body yields 2 * outputs * arguments values.

    ```mlir
    spectra.feature_partials @posrf_partials of @posrf(%wx, %xx, %ww, %p0) {
      %zero = arith.constant 0.000000e+00 : f32
      %one = arith.constant 1.000000e+00 : f32
      %mhalf = arith.constant -5.000000e-01 : f32
      spectra.partials_yield %one, %zero, %mhalf, %zero, %zero, %zero, %zero, %one : f32, f32, f32, f32, f32, f32, f32, f32
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, FlatSymbolRefAttr:$component);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name `of` $component `` custom<F32ArgsRegion>($body) attr-dict-with-keyword";
  let hasRegionVerifier = 1;
}

def Spectra_PartialsYieldOp : Spectra_Op<"partials_yield", [
    Pure, Terminator, ReturnLike, HasParent<"FeaturePartialsOp">]> {
  let summary = "ends a feature_partials body";
  let description = [{
    Constraints: those of the parent (C3 there).

    ```mlir
    spectra.partials_yield %a, %b : f32, f32
    ```
  }];
  let arguments = (ins Variadic<F32>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
}

#endif // SPECTRA_DIALECT_DERIVATIVEOPS_TD
