//===- ComponentOps.td - component functions and data statistics ---------===//
//
// A component function turns the per-feature scalars w^T x, ||x||^2, ||w||^2
// into features. Its body yields every output as `coeff * exp(logit)`: the
// exponential form is explicit so the stabiliser can subtract constants from
// logits without pattern-matching arbitrary arithmetic. Its parameter region
// computes per-(batch, head) parameters from explicit statistics.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_DIALECT_COMPONENTOPS_TD
#define SPECTRA_DIALECT_COMPONENTOPS_TD

include "dialect/SpectraBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Spectra_ComponentOp : Spectra_Op<"component", [
    Symbol, IsolatedFromAbove,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmBlockArgumentNames"]>]> {
  let summary = "a component function: features as coeff * exp(logit) of w^T x, ||x||^2, ||w||^2";
  let description = [{
    Two regions:

    * `params`, arguments `(%m: f32, %d: f32)`: computes per-(batch, head)
      parameters from `spectra.statistic` values with `arith`/`math` ops
      (elementwise on rank-1 tensors too) and `spectra.option` values, and ends
      in `spectra.params_yield`. It may also yield diagonal input transforms
      `query_scale` / `key_scale` (SADERF's Psi, HCEXP's A): features are then
      computed on `diag(query_scale) q` and `diag(key_scale) k`.
    * `features`, arguments `(%wx: f32, %xx: f32, %ww: f32, %p0: f32, ...)`:
      the per-feature scalars followed by the scalar parameters, evaluated once
      per row `w_i` of W and ending in `spectra.feature_yield`, which gives
      each output as a `(logit, coeff)` pair meaning `coeff * exp(logit)`.
      With k outputs and m rows, `phi(x)` has k*m entries.

    The body is the same for queries and keys; signed per-row weights of the
    weight recipe (SGQ) multiply `phi(k)`.

    Constraints:
    * C1: `params` has exactly two `f32` arguments (m, d).
    * C2: `params` ends in `spectra.params_yield` and `features` in
      `spectra.feature_yield`.
    * C3: `features` has 3 + (number of yielded scalar parameters) arguments,
      all `f32`.
    * C4: option names are unique within the component.

    ```mlir
    spectra.component @posrf params(%m, %d) {
      %c = math.rsqrt %m : f32
      spectra.params_yield scalars(%c : f32)
    } features(%wx, %xx, %ww, %c) {
      %half = arith.constant 0.5 : f32
      %h = arith.mulf %xx, %half : f32
      %l = arith.subf %wx, %h : f32
      spectra.feature_yield exp(%l : f32) scaled(%c : f32)
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name);
  let regions = (region SizedRegion<1>:$params, SizedRegion<1>:$features);
  let assemblyFormat = [{
    $sym_name `params` `` custom<F32ArgsRegion>($params)
    `features` `` custom<F32ArgsRegion>($features) attr-dict-with-keyword
  }];
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    /// Number of outputs per row of W (k), so phi has k*m entries.
    unsigned getNumOutputs();
    /// The names of the options declared in the params region.
    ::llvm::SmallVector<::llvm::StringRef> getOptionNames();
    /// True when the params region yields query/key input transforms.
    bool hasInputTransforms();
    /// The params region's terminator (its scalars and input scales); null where the region
    /// is empty or does not end in one (the verifier's C2 reports that).
    ParamsYieldOp getParamsYield();
  }];
}

def Spectra_StatisticOp : Spectra_Op<"statistic", [
    Pure, HasParent<"ComponentOp">]> {
  let summary = "a reduction over the sequence of one (batch, head) of the queries or keys";
  let description = [{
    Kinds: `mean` (per-dimension mean, rank-1), `mean_square` (per-dimension
    mean of squares, rank-1), `sum_square` (per-dimension sum of squares,
    rank-1), `mean_sq_norm` (mean of `||x||^2`, scalar), `count` (number of
    tokens, scalar). Key statistics count only keys the padding mask keeps.
    The planner fuses all statistics of a variant into one prologue pass.

    Constraints:
    * C1: vector kinds (`mean`, `mean_square`, `sum_square`) have a rank-1
      float tensor result; scalar kinds (`mean_sq_norm`, `count`) an `f32`.

    ```mlir
    %sk = spectra.statistic sum_square of keys : tensor<?xf32>
    ```
  }];
  let arguments = (ins Spectra_StatisticKind:$kind, Spectra_Side:$side);
  let results = (outs AnyType:$result);
  let assemblyFormat = "$kind `of` $side attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Spectra_DotOp : Spectra_Op<"dot", [Pure]> {
  let summary = "inner product of two rank-1 tensors";
  let description = [{
    Constraints:
    * C1: both operands have the same type.

    ```mlir
    %u = spectra.dot %a, %b : tensor<?xf32>, tensor<?xf32> -> f32
    ```
  }];
  let arguments = (ins Spectra_Vector:$lhs, Spectra_Vector:$rhs);
  let results = (outs F32:$result);
  let assemblyFormat =
      "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)";
  let hasVerifier = 1;
}

def Spectra_SplatOp : Spectra_Op<"splat", [Pure]> {
  let summary = "a scalar as a per-dimension tensor (every entry equal)";
  let description = [{
    Combines a scalar with per-dimension statistics in a params region, where
    arith ops need both operands of one type: the result has the head
    dimension's length and every entry equal to the operand.

    ```mlir
    %floor = arith.constant 1.000000e-20 : f32
    %f = spectra.splat %floor : f32 -> tensor<?xf32>
    %sq = arith.addf %sum, %f : tensor<?xf32>
    ```
  }];
  let arguments = (ins F32:$value);
  let results = (outs Spectra_Vector:$result);
  let assemblyFormat = "$value attr-dict `:` type($value) `->` type($result)";
}

def Spectra_OptionOp : Spectra_Op<"option", [Pure, HasParent<"ComponentOp">]> {
  let summary = "a named scalar option of a component, with its default";
  let description = [{
    The value a `spectra.feature_map` sets in its `options` dictionary, or the
    default (GERF's A).

    Constraints:
    * C1: the default is finite.

    ```mlir
    %a = spectra.option "a" default -1.000000e-01 : f32
    ```
  }];
  let arguments = (ins StrAttr:$name, F32Attr:$default_value);
  let results = (outs F32:$result);
  let assemblyFormat = "$name `default` $default_value attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Spectra_ParamsYieldOp : Spectra_Op<"params_yield", [
    Pure, Terminator, ReturnLike, HasParent<"ComponentOp">, AttrSizedOperandSegments]> {
  let summary = "ends a params region: scalar parameters and optional input transforms";
  let description = [{
    Constraints:
    * C1: `query_scale` and `key_scale` are both given or both absent.
    * C2: the scales are rank-1 float tensors of the same type.
    * C3: the op terminates the `params` region.

    ```mlir
    spectra.params_yield scalars(%a, %b : f32, f32) query_scale(%psi : tensor<?xf32>) key_scale(%ipsi : tensor<?xf32>)
    ```
  }];
  let arguments = (ins Variadic<F32>:$scalars,
                       Optional<Spectra_Vector>:$query_scale,
                       Optional<Spectra_Vector>:$key_scale);
  let assemblyFormat = [{
    `scalars` `(` ($scalars^ `:` type($scalars))? `)`
    (`query_scale` `(` $query_scale^ `:` type($query_scale) `)`)?
    (`key_scale` `(` $key_scale^ `:` type($key_scale) `)`)? attr-dict
  }];
  let hasVerifier = 1;
}

def Spectra_FeatureYieldOp : Spectra_Op<"feature_yield", [
    Pure, Terminator, ReturnLike, HasParent<"ComponentOp">, AttrSizedOperandSegments]> {
  let summary = "ends a features region: outputs as coeff * exp(logit)";
  let description = [{
    Constraints:
    * C1: at least one output.
    * C2: as many coefficients as logits.
    * C3: the op terminates the `features` region.

    ```mlir
    spectra.feature_yield exp(%l0, %l1 : f32, f32) scaled(%c0, %c1 : f32, f32)
    ```
  }];
  let arguments = (ins Variadic<F32>:$logits, Variadic<F32>:$coeffs);
  let assemblyFormat = [{
    `exp` `(` ($logits^ `:` type($logits))? `)` `scaled` `(` ($coeffs^ `:` type($coeffs))? `)`
    attr-dict
  }];
  let hasVerifier = 1;
}

#endif // SPECTRA_DIALECT_COMPONENTOPS_TD
