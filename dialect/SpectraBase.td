//===- SpectraBase.td - spectra dialect, base op class and enums ---------===//
//
// The dialect-wide definitions every op file includes: the dialect, the base
// op class and the enums that print as words.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_DIALECT_SPECTRABASE_TD
#define SPECTRA_DIALECT_SPECTRABASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def Spectra_Dialect : Dialect {
  let name = "spectra";
  let cppNamespace = "::mlir::spectra";
  let summary = "Random-feature (spectral) attention: weight recipes, component functions, attention";
  let description = [{
    The `spectra` dialect declares a random feature `phi` as two composable
    halves, following the Spectraformer framework:

    * a **weight recipe** (`spectra.weight_recipe`): how the frequency matrix
      `W` (m x d) is drawn, written as a chain of building blocks (gaussian,
      orthogonalise, chi norms, Hadamard-diagonal chains, low-discrepancy
      sequences, inverse normal CDF, moment matching, sparse grids, FastFood
      factors, block stacking, scaling);
    * a **component function** (`spectra.component`): how the per-feature
      scalars `w^T x`, `||x||^2`, `||w||^2` become features, written as a
      region yielding `coeff * exp(logit)` pairs, with a parameter region over
      data statistics (`spectra.statistic`).

    `spectra.feature_map` pairs the two, and `spectra.attention` computes
    non-causal, optionally key-masked linear attention
    `phi(q)^T S / phi(q)^T z` with it. The named recipes and components of the
    paper ship as a library written in this dialect (dialect/library).
  }];
  let hasConstantMaterializer = 1;
  // spectra.may_alias on a function's arguments (SpectraDialect.h).
  let hasRegionArgAttrVerify = 1;
}

/// Base class of every spectra op. Dialect-wide invariant: every op verifies
/// its numbered constraints (C1..Cn, listed in its description) and names the
/// constraint in its diagnostics, through spectra::constraintError.
class Spectra_Op<string mnemonic, list<Trait> traits = []>
    : Op<Spectra_Dialect, mnemonic, traits>;

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def Spectra_SequenceHalton : I32EnumAttrCase<"halton", 0>;
def Spectra_SequenceSobol  : I32EnumAttrCase<"sobol", 1>;
def Spectra_Sequence : I32EnumAttr<"Sequence", "low-discrepancy sequence",
    [Spectra_SequenceHalton, Spectra_SequenceSobol]> {
  let cppNamespace = "::mlir::spectra";
}

def Spectra_SideQueries : I32EnumAttrCase<"queries", 0>;
def Spectra_SideKeys    : I32EnumAttrCase<"keys", 1>;
def Spectra_Side : I32EnumAttr<"Side", "which input of the attention a statistic reduces",
    [Spectra_SideQueries, Spectra_SideKeys]> {
  let cppNamespace = "::mlir::spectra";
}

def Spectra_StatMean       : I32EnumAttrCase<"mean", 0>;
def Spectra_StatMeanSquare : I32EnumAttrCase<"mean_square", 1>;
def Spectra_StatSumSquare  : I32EnumAttrCase<"sum_square", 2>;
def Spectra_StatMeanSqNorm : I32EnumAttrCase<"mean_sq_norm", 3>;
def Spectra_StatCount      : I32EnumAttrCase<"count", 4>;
def Spectra_StatisticKind : I32EnumAttr<"StatisticKind",
    "a reduction over the sequence of one (batch, head)",
    [Spectra_StatMean, Spectra_StatMeanSquare, Spectra_StatSumSquare,
     Spectra_StatMeanSqNorm, Spectra_StatCount]> {
  let cppNamespace = "::mlir::spectra";
}

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

def Spectra_Matrix : RankedTensorOf<[AnyFloat], [HasAnyRankOfPred<[2]>], "rank-2 float tensor">;
def Spectra_Vector : RankedTensorOf<[AnyFloat], [HasAnyRankOfPred<[1]>], "rank-1 float tensor">;
def Spectra_FloatArray : RankedTensorOf<[AnyFloat], [HasAnyRankOfPred<[1, 2]>],
                                        "rank-1 or rank-2 float tensor">;
def Spectra_Permutation : RankedTensorOf<[I64], [HasAnyRankOfPred<[1]>], "rank-1 i64 tensor">;
def Spectra_Activation : RankedTensorOf<[F16, BF16, F32, F64], [HasAnyRankOfPred<[4]>],
                                        "rank-4 f16/bf16/f32/f64 tensor">;
def Spectra_Mask : RankedTensorOf<[I1], [HasAnyRankOfPred<[2]>], "rank-2 i1 tensor">;

#endif // SPECTRA_DIALECT_SPECTRABASE_TD
