//===- AttentionOps.td - feature maps and attention ----------------------===//

#ifndef SPECTRA_DIALECT_ATTENTIONOPS_TD
#define SPECTRA_DIALECT_ATTENTIONOPS_TD

include "dialect/SpectraBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Spectra_FeatureMapOp : Spectra_Op<"feature_map", [
    Symbol, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "a random feature: a component function paired with a weight recipe";
  let description = [{
    Instantiates the weight recipe with `m` rows, head dimension `d` and the
    seed, and the component function with the options given (unset options
    take their defaults). The symbol name follows the variant grammar
    `<component>-<weights>` with `-` spelled `_`.

    Constraints:
    * C1: `weights` names a `spectra.weight_recipe`.
    * C2: `component` names a `spectra.component`.
    * C3: `m` >= 1, `d` >= 1, `seed` >= 0.
    * C4: every key of `options` is an option the component or the weight
      recipe declares; a component's option has a float value.
    * C5: a weight recipe's option (`spectra.recipe_option`) has an integer
      value >= 1.

    ```mlir
    spectra.feature_map @posrf_orf component @posrf weights @orf m = 128 d = 32 seed = 0
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, FlatSymbolRefAttr:$component,
                       FlatSymbolRefAttr:$weights, I64Attr:$m, I64Attr:$d, I64Attr:$seed,
                       OptionalAttr<DictionaryAttr>:$options);
  let assemblyFormat = [{
    $sym_name `component` $component `weights` $weights `m` `=` $m `d` `=` $d `seed` `=` $seed
    (`options` $options^)? attr-dict
  }];
  let hasVerifier = 1;
}

def Spectra_AttentionOp : Spectra_Op<"attention", [
    Pure, AttrSizedOperandSegments, DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "random-feature attention phi(q)^T S / phi(q)^T z, bidirectional or causal";
  let description = [{
    For q: [B, H, Nq, D], k: [B, H, Nk, D], v: [B, H, Nk, Dv] computes
    `out_i = phi(s q_i)^T S / phi(s q_i)^T z` with `S = sum_j phi(s k_j) v_j^T`
    and `z = sum_j phi(s k_j)` per (batch, head), `s = D^(-1/4)` unless
    `scale` is given, so that the target kernel is softmax's
    `exp(q^T k / sqrt(D))`. With `mask` (i1 [B, Nk], true = keep), the features
    of masked keys are zero: padded keys contribute nothing. With `query_mask`
    (i1 [B, Nq], true = keep; self-attention passes the same padding), padded
    queries are left out of the statistics the component's parameters use
    (OPRF's A*, SADERF's Psi, HCEXP's A); their outputs are still computed.
    Keys are stabilised with one constant per feature and queries with one
    per query, so the result is finite wherever the estimator is (see
    REFERENCE-NOTES and the runtime's Reference.h).

    Constraints:
    * C1: `feature_map` names a `spectra.feature_map`.
    * C2: q, k and v have the same element type, and so has the result.
    * C3: batch and head sizes agree across q, k, v and the result.
    * C4: k and v have the same sequence length; q and k the same head dimension.
    * C5: the head dimension equals the feature map's `d`.
    * C6: the mask is [B, Nk].
    * C7: the result is [B, H, Nq, Dv].
    * C8: a given `scale` is positive.
    * C9: the query mask is [B, Nq].
    * C10: `causal` attention has Nq = Nk.
    * C11: `causal` attention's component has no parameters computed from data statistics
      (`spectra.statistic` over the whole sequence would let a token see later tokens).

    With `causal`, `out_i` sums over the keys `j <= i` only (the prefix of the sequence),
    computed in chunks with an exact per-feature running stabiliser (CAUSAL-NOTES.md).

    ```mlir
    %o = spectra.attention %q, %k, %v mask %mask query_mask %mask feature_map @posrf_orf
        : tensor<2x4x128x32xf32>, tensor<2x4x128x32xf32>, tensor<2x4x128x32xf32>,
          tensor<2x128xi1>, tensor<2x128xi1> -> tensor<2x4x128x32xf32>
    %c = spectra.attention %q, %k, %v causal feature_map @posrf_orf
        : tensor<2x4x128x32xf32>, tensor<2x4x128x32xf32>, tensor<2x4x128x32xf32>
          -> tensor<2x4x128x32xf32>
    ```
  }];
  let arguments = (ins Spectra_Activation:$query, Spectra_Activation:$key,
                       Spectra_Activation:$value, Optional<Spectra_Mask>:$mask,
                       Optional<Spectra_Mask>:$query_mask,
                       FlatSymbolRefAttr:$feature_map, OptionalAttr<F64Attr>:$scale,
                       UnitAttr:$causal);
  let results = (outs Spectra_Activation:$result);
  let assemblyFormat = [{
    $query `,` $key `,` $value (`mask` $mask^)? (`query_mask` $query_mask^)?
    (`causal` $causal^)? `feature_map` $feature_map attr-dict
    `:` type($query) `,` type($key) `,` type($value) ``
    custom<MaskTypes>(ref($mask), ref($query_mask), type($mask), type($query_mask))
    `->` type($result)
  }];
  let hasVerifier = 1;
}

#endif // SPECTRA_DIALECT_ATTENTIONOPS_TD
