//===- WeightOps.td - weight-recipe building blocks ----------------------===//
//
// Ops that declare how a random-feature weight matrix W (m x d) is drawn.
// They are declarative: the runtime's WeightFactory materialises a recipe with
// LibTorch numerics. Every random op draws independently of every other op
// (and of every replica of a spectra.stack_blocks body), so none is Pure.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_DIALECT_WEIGHTOPS_TD
#define SPECTRA_DIALECT_WEIGHTOPS_TD

include "dialect/SpectraBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"

def Spectra_WeightRecipeOp : Spectra_Op<"weight_recipe", [
    Symbol, IsolatedFromAbove, SingleBlock,
    DeclareOpInterfaceMethods<OpAsmOpInterface, ["getAsmBlockArgumentNames"]>]> {
  let summary = "a named recipe for drawing a weight matrix W (m x d)";
  let description = [{
    The body is a graph of building blocks over two `index` arguments, the
    feature count `m` and the head dimension `d`, that yields `W` (rank 2,
    `m x d`) and optionally signed per-row weights `a` (rank 1, `m`), which the
    component function multiplies into `phi(k)` (quadrature rules such as SGQ).
    A recipe is instantiated by a `spectra.feature_map` that fixes `m`, `d` and
    the seed.

    Constraints:
    * C1: the body has exactly two arguments, both `index` (`m`, `d`).
    * C2: the body yields a rank-2 tensor, optionally followed by a rank-1 tensor.
    * C3: every value drawn `learnable` reaches W (through the ops that use it,
      `stack_blocks` included): a trainable factor that W does not depend on
      would never train.
    * C4: no value computed from a `learnable` one feeds
      `spectra.moment_match` (it re-standardises its input on every build,
      undoing what is learned); a fixed recipe belongs there. (The other op
      that needs a fixed input, `spectra.inverse_normal_cdf`, takes only
      uniform or low-discrepancy points, which are never learnable.)

    ```mlir
    spectra.weight_recipe @base(%m, %d) {
      %w = spectra.gaussian [%m, %d] : tensor<?x?xf32>
      spectra.yield %w : tensor<?x?xf32>
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name);
  let regions = (region SizedRegion<1>:$body);
  // The arguments are part of the op syntax, `@orf(%m, %d) {...}`, so the
  // parser defines them inside the isolated name scope.
  let assemblyFormat = "$sym_name `` custom<IndexArgsRegion>($body) attr-dict-with-keyword";
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::Value getM() { return getBody().front().getArgument(0); }
    ::mlir::Value getD() { return getBody().front().getArgument(1); }
    /// True when the recipe yields signed per-row weights besides W.
    bool hasRowWeights();
    /// The names of the recipe's `spectra.recipe_option`s, in body order.
    ::llvm::SmallVector<::llvm::StringRef> getOptionNames();
  }];
  let skipDefaultBuilders = 1;
  let builders = [OpBuilder<(ins "::llvm::StringRef":$name)>];
}

def Spectra_YieldOp : Spectra_Op<"yield", [
    Pure, Terminator, ReturnLike,
    ParentOneOf<["WeightRecipeOp", "StackBlocksOp"]>]> {
  let summary = "yields the values of a weight recipe or of one stacked block";
  let description = [{
    Terminates `spectra.weight_recipe` and `spectra.stack_blocks` bodies.
    The verifier of the parent checks what may be yielded.

    ```mlir
    spectra.yield %w, %a : tensor<?x?xf32>, tensor<?xf32>
    ```
  }];
  let arguments = (ins Variadic<AnyType>:$values);
  let assemblyFormat = "($values^ `:` type($values))? attr-dict";
}

//===----------------------------------------------------------------------===//
// Random draws
//===----------------------------------------------------------------------===//

class Spectra_DrawOp<string mnemonic, list<Trait> traits = []>
    : Spectra_Op<mnemonic, traits> {
  let hasVerifier = 1;
}

def Spectra_GaussianOp : Spectra_DrawOp<"gaussian"> {
  let summary = "iid standard normal entries";
  let description = [{
    A vector or matrix of independent N(0, 1) samples, with one `index` size
    per result dimension. With `learnable`, the runtime makes the drawn tensor
    a trainable parameter (FastFoodL's G).

    Constraints:
    * C1: one size operand per result dimension.
    * C2: a size known as a constant is positive and equals the static result
      dimension, if that is static.

    ```mlir
    %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
    %diag = spectra.gaussian [%n] learnable : tensor<?xf32>
    ```
  }];
  let arguments = (ins Variadic<Index>:$sizes, UnitAttr:$learnable);
  let results = (outs Spectra_FloatArray:$result);
  let assemblyFormat = "` ` `[` $sizes `]` (`learnable` $learnable^)? attr-dict `:` type($result)";
}

def Spectra_UniformOp : Spectra_DrawOp<"uniform"> {
  let summary = "iid uniform points in the open unit cube";
  let description = [{
    `rows x cols` independent U(0, 1) samples (0 excluded): Monte Carlo points
    for `spectra.inverse_normal_cdf`.

    Constraints:
    * C1: one size operand per result dimension.
    * C2: a size known as a constant is positive and equals the static result
      dimension, if that is static.

    ```mlir
    %u = spectra.uniform [%m, %d] : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Variadic<Index>:$sizes);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "` ` `[` $sizes `]` attr-dict `:` type($result)";
}

def Spectra_RademacherOp : Spectra_DrawOp<"rademacher"> {
  let summary = "iid random signs (+1/-1), a Rademacher diagonal";
  let description = [{
    Constraints:
    * C1: one size operand per result dimension.
    * C2: a size known as a constant is positive and equals the static result
      dimension, if that is static.

    ```mlir
    %b = spectra.rademacher [%n] learnable : tensor<?xf32>
    ```
  }];
  let arguments = (ins Variadic<Index>:$sizes, UnitAttr:$learnable);
  let results = (outs Spectra_Vector:$result);
  let assemblyFormat = "` ` `[` $sizes `]` (`learnable` $learnable^)? attr-dict `:` type($result)";
}

def Spectra_ChiOp : Spectra_DrawOp<"chi"> {
  let summary = "iid chi-distributed norms with `dof` degrees of freedom";
  let description = [{
    Samples of `||g||`, `g ~ N(0, I_dof)`: the row norms of an iid Gaussian
    matrix, used to rescale orthogonal rows (ORF) or as FastFood's S.

    Constraints:
    * C1: one size operand per result dimension.
    * C2: a size known as a constant is positive and equals the static result
      dimension, if that is static.
    * C3: `dof`, if constant, is positive.

    ```mlir
    %s = spectra.chi [%d] dof %d : tensor<?xf32>
    ```
  }];
  let arguments = (ins Variadic<Index>:$sizes, Index:$dof, UnitAttr:$learnable);
  let results = (outs Spectra_Vector:$result);
  let assemblyFormat =
      "` ` `[` $sizes `]` `dof` $dof (`learnable` $learnable^)? attr-dict `:` type($result)";
}

def Spectra_PermutationOp : Spectra_DrawOp<"permutation"> {
  let summary = "a uniformly random permutation of 0..n-1";
  let description = [{
    Constraints:
    * C1: one size operand per result dimension.
    * C2: a size known as a constant is positive and equals the static result
      dimension, if that is static.

    ```mlir
    %p = spectra.permutation [%n] : tensor<?xi64>
    ```
  }];
  let arguments = (ins Variadic<Index>:$sizes);
  let results = (outs Spectra_Permutation:$result);
  let assemblyFormat = "` ` `[` $sizes `]` attr-dict `:` type($result)";
}

def Spectra_LowDiscrepancyOp : Spectra_DrawOp<"low_discrepancy"> {
  let summary = "the first `rows` points of a low-discrepancy sequence in [0,1]^cols";
  let description = [{
    Row i is the i-th point of the sequence (Halton: radical inverses in the
    first `cols` primes; Sobol: Joe-Kuo direction numbers). With
    `random_shift` the point set is shifted modulo 1 by a uniform vector drawn
    from the seed (a randomised QMC rule); points equal to 0 or 1 are moved
    into the open cube so that `spectra.inverse_normal_cdf` stays finite.

    Constraints:
    * C1: one size operand per result dimension.
    * C2: a size known as a constant is positive and equals the static result
      dimension, if that is static.
    * C3: a constant `cols` is at most 21201 for Sobol (the direction numbers
      shipped) and at most 10000 for Halton.

    ```mlir
    %t = spectra.low_discrepancy halton [%m, %d] random_shift : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_Sequence:$sequence, Variadic<Index>:$sizes,
                       UnitAttr:$random_shift);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat =
      "$sequence ` ` `[` $sizes `]` (`random_shift` $random_shift^)? attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Deterministic transforms
//===----------------------------------------------------------------------===//

def Spectra_InverseNormalCdfOp : Spectra_Op<"inverse_normal_cdf", [
    Pure, SameOperandsAndResultType]> {
  let summary = "elementwise Phi^{-1} (ndtri): unit-cube points to Gaussian points";
  let description = [{
    Constraints:
    * C1: the input is a point set in the open unit cube, i.e. produced by
      `spectra.low_discrepancy` or `spectra.uniform`.

    ```mlir
    %w = spectra.inverse_normal_cdf %t : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_Matrix:$points);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "$points attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Spectra_OrthogonalizeOp : Spectra_Op<"orthogonalize", [
    Pure, SameOperandsAndResultType]> {
  let summary = "orthonormal rows from a Gaussian block (sign-corrected QR, Haar)";
  let description = [{
    Returns Q from `G^T = Q R`, with the signs of Q's columns fixed by
    `sign(diag(R))` so that Q is Haar-distributed, transposed back so that the
    result has orthonormal **rows**. Compose with `spectra.chi` and
    `spectra.scale_rows` for ORF's chi-distributed row norms.

    Constraints:
    * C1: the input is a Gaussian draw (`spectra.gaussian`), the distribution
      for which sign-corrected QR is Haar.
    * C2: rows <= cols when both are known (at most `cols` orthonormal rows).

    ```mlir
    %q = spectra.orthogonalize %g : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_Matrix:$input);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Spectra_ScaleRowsOp : Spectra_Op<"scale_rows", [Pure]> {
  let summary = "diag(v) * X: scale row i of X by v_i";
  let description = [{
    Constraints:
    * C1: the result type equals the matrix type.
    * C2: the vector length equals the matrix row count when both are known.

    ```mlir
    %w = spectra.scale_rows %q, %norms : tensor<?x?xf32>, tensor<?xf32>
    ```
  }];
  let arguments = (ins Spectra_Matrix:$matrix, Spectra_Vector:$factors);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat =
      "$matrix `,` $factors attr-dict `:` type($matrix) `,` type($factors) `->` type($result)";
  let hasVerifier = 1;
}

def Spectra_ScaleOp : Spectra_Op<"scale", [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = "multiply by base^exponent, base an index value (e.g. sqrt(n), 1/sqrt(d))";
  let description = [{
    Constraints:
    * C1: a constant base is positive.

    ```mlir
    %s = spectra.scale %h by %n pow 0.5 : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_FloatArray:$input, Index:$base, F64Attr:$exponent);
  let results = (outs Spectra_FloatArray:$result);
  let assemblyFormat = "$input `by` $base `pow` $exponent attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Spectra_NextPowerOfTwoOp : Spectra_Op<"next_pow2", [Pure]> {
  let summary = "the smallest power of two >= n (Hadamard sizes)";
  let description = [{
    Constraints:
    * C1: a constant operand is positive.

    ```mlir
    %n = spectra.next_pow2 %d
    ```
  }];
  let arguments = (ins Index:$value);
  let results = (outs Index:$result);
  let assemblyFormat = "$value attr-dict";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Spectra_HadamardDiagonalChainOp : Spectra_DrawOp<"hadamard_diagonal_chain"> {
  let summary = "H D1 H D2 ... H Dk: Walsh-Hadamard matrices times Rademacher diagonals";
  let description = [{
    An `n x n` product of `length` factors `H D_i`, H the Walsh-Hadamard matrix
    (normalised so that `H H^T = I` when `normalized` is set, entries +-1
    otherwise) and D_i independent Rademacher diagonals. SORF is
    `sqrt(n) * H D1 H D2 H D3`.

    Constraints:
    * C1: one size operand per result dimension.
    * C2: a size known as a constant is positive and equals the static result
      dimension, if that is static.
    * C3: `length` >= 1.
    * C4: a constant size is a power of two.

    ```mlir
    %c = spectra.hadamard_diagonal_chain [%n, %n] length 3 normalized : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Variadic<Index>:$sizes, I64Attr:$length,
                       UnitAttr:$normalized);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat =
      "` ` `[` $sizes `]` `length` $length (`normalized` $normalized^)? attr-dict `:` type($result)";
}

def Spectra_TakeColumnsOp : Spectra_Op<"take_cols", [Pure]> {
  let summary = "the leading `count` columns of a matrix";
  let description = [{
    Constraints:
    * C1: a constant `count` is positive and at most the column count when that
      is known.

    ```mlir
    %w = spectra.take_cols %s, %d : tensor<?x?xf32> -> tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_Matrix:$input, Index:$count);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "$input `,` $count attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Spectra_MomentMatchOp : Spectra_Op<"moment_match", [Pure, SameOperandsAndResultType]> {
  let summary = "A^{-1}(P_i - mean): sample mean exactly 0, sample covariance exactly I";
  let description = [{
    A is the Cholesky factor of the sample covariance of the rows of P.

    Constraints:
    * C1: rows > cols when both are known (the sample covariance of fewer
      points than dimensions is singular).

    ```mlir
    %w = spectra.moment_match %p : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_Matrix:$points);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "$points attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Spectra_SparseGridOp : Spectra_Op<"sparse_grid", [Pure]> {
  let summary = "degree-3 Smolyak sparse grid for N(0, I_d): 2d+1 points and signed weights";
  let description = [{
    Built from the 3-point Gauss-Hermite rule: points
    `[0, +sqrt(3) e_1..e_d, -sqrt(3) e_1..e_d]` with weights `1 - d/3` (centre,
    negative for d > 3) and `1/6`. The weights sum to 1 and integrate all
    polynomials of total degree <= 3 exactly against N(0, I_d).

    Constraints:
    * C1: `degree` is 3 (the only rule provided).
    * C2: with a constant `d`, static result dimensions are `2d+1 x d` and `2d+1`.

    ```mlir
    %p, %a = spectra.sparse_grid [%d] degree 3 : tensor<?x?xf32>, tensor<?xf32>
    ```
  }];
  let arguments = (ins Index:$dim, I64Attr:$degree);
  let results = (outs Spectra_Matrix:$points, Spectra_Vector:$weights);
  let assemblyFormat =
      "` ` `[` $dim `]` `degree` $degree attr-dict `:` type($points) `,` type($weights)";
  let hasVerifier = 1;
}

def Spectra_RotateOp : Spectra_Op<"rotate", [Pure, AllTypesMatch<["points", "result"]>]> {
  let summary = "P Q^T: rotate every point (row of P) by the orthogonal Q";
  let description = [{
    Constraints:
    * C1: Q is square when its sizes are known.
    * C2: P and Q have the same column count when both are known.

    ```mlir
    %r = spectra.rotate %p by %q : tensor<?x?xf32>, tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_Matrix:$points, Spectra_Matrix:$rotation);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat =
      "$points `by` $rotation attr-dict `:` type($points) `,` type($rotation)";
  let hasVerifier = 1;
}

def Spectra_SphericalRadialOp : Spectra_Op<"spherical_radial", [Pure]> {
  let summary = "the degree-3 stochastic spherical-radial rule for N(0, I_d): 2d+3 points, signed weights";
  let description = [{
    Genz and Monahan's rule, as SSR (Munkhoeva et al., 2018) uses it: for a
    radius `rho` (drawn `chi_{d+2}`), the points are the origin and
    `+-rho v_j` for the d+1 vertices v_j of a unit regular simplex in R^d
    (pairwise inner product -1/d), with weights `1 - d/rho^2` (centre,
    negative when rho^2 < d) and `d / (2 (d+1) rho^2)` (the others). For every
    rho the weights sum to 1, the first and third moments vanish and the second
    is I_d; with rho ~ chi_{d+2} and a random rotation of the points the rule is
    an unbiased estimate of every Gaussian integral.

    Constraints:
    * C1: the radius is a rank-1 tensor of length 1 when its length is known.
    * C2: with a constant `d`, static result dimensions are `2d+3 x d` and `2d+3`.

    ```mlir
    %p, %a = spectra.spherical_radial [%d] radius %rho : tensor<?xf32> -> tensor<?x?xf32>, tensor<?xf32>
    ```
  }];
  let arguments = (ins Index:$dim, Spectra_Vector:$radius);
  let results = (outs Spectra_Matrix:$points, Spectra_Vector:$weights);
  let assemblyFormat =
      "` ` `[` $dim `]` `radius` $radius attr-dict `:` type($radius) `->` type($points) `,` type($weights)";
  let hasVerifier = 1;
}

def Spectra_SimplexOp : Spectra_Op<"simplex", [Pure]> {
  let summary = "the n vertices of a regular simplex centred at the origin, as unit rows";
  let description = [{
    An `n x n` matrix whose rows are unit vectors with pairwise inner product
    -1/(n-1) (the most obtuse angle n directions can share; they span the
    subspace orthogonal to the all-ones vector): row i = (e_i - 1/n) /
    sqrt(1 - 1/n). Randomly rotated (`spectra.rotate`) and given chi norms, its
    rows are SimRF's frequencies (Reid et al., 2023).

    Constraints:
    * C1: n, if constant, is at least 2.
    * C2: the result is square; a static result dimension equals n when n is
      constant.

    ```mlir
    %s = spectra.simplex [%d] : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Index:$size);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "` ` `[` $size `]` attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Spectra_NormCouplingOp : Spectra_Op<"norm_coupling", [Pure, SameOperandsAndResultType]> {
  let summary = "rows turned, one at a time, to point opposite the sum of the others, norms kept";
  let description = [{
    SimRF+'s weight-dependent coupling (Reid et al., 2023): for i = 1..n in
    turn, `w_i <- -||w_i|| s_i / ||s_i||` with `s_i` the sum of the other rows
    (as they are at that moment; a row whose `s_i` is zero is left alone),
    repeated `sweeps` times. Each update minimises `w_i . s_i` with the others
    fixed, so `||sum_i w_i||^2`, and with it the sum of the pairwise inner
    products `sum_{i<j} w_i . w_j`, never increases (with norms that satisfy
    the polygon inequality it reaches 0). Only directions change: with chi
    norms, the same simplex start and a random rotation applied afterwards
    (`spectra.rotate`), every row stays marginally N(0, I). Differentiable in
    its input.

    Constraints:
    * C1: `sweeps` is at least 1.
    * C2: the input has at least 2 rows when its row count is known.

    ```mlir
    %c = spectra.norm_coupling %b sweeps 3 : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_Matrix:$input, I64Attr:$sweeps);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "$input `sweeps` $sweeps attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Spectra_CirculantOp : Spectra_Op<"circulant", [Pure]> {
  let summary = "the circulant matrix of a vector: row i is the vector rotated right by i";
  let description = [{
    `C[i][j] = c[(j - i) mod n]` for the length-n vector c: every row is a cyclic
    shift of c, so a Gaussian c gives rows that are each N(0, I) (SCRF's blocks,
    Feng et al., 2015, with random signs from `spectra.rademacher` and
    `spectra.scale_rows`).

    Constraints:
    * C1: the result is square, n x n when the vector's length is static.

    ```mlir
    %p = spectra.circulant %c : tensor<?xf32> -> tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_Vector:$vector);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "$vector attr-dict `:` type($vector) `->` type($result)";
  let hasVerifier = 1;
}

def Spectra_FastFoodOp : Spectra_Op<"fastfood", [Pure]> {
  let summary = "a FastFood block (1/sqrt(n)) S H G Pi H B from its factors";
  let description = [{
    H is the unnormalised Walsh-Hadamard matrix, `B = diag(b)`, `Pi` the
    permutation, `G = diag(g)` and `S = diag(s / ||g||_F)`, so that with
    `s ~ chi_n` the rows have chi_n norms. Factors drawn with `learnable`
    become trainable parameters and W is formed differentiably from them.

    Constraints:
    * C1: s, g, b and the permutation have the same length when known.
    * C2: a known length is a power of two.
    * C3: the result is `n x n` when n is known.

    ```mlir
    %v = spectra.fastfood %s, %g, %p, %b : tensor<?xf32>, tensor<?xf32>, tensor<?xi64>, tensor<?xf32> -> tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_Vector:$s, Spectra_Vector:$g, Spectra_Permutation:$perm,
                       Spectra_Vector:$b);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat =
      "$s `,` $g `,` $perm `,` $b attr-dict `:` type($s) `,` type($g) `,` type($perm) `,` "
      "type($b) `->` type($result)";
  let hasVerifier = 1;
}

def Spectra_RecipeOptionOp : Spectra_Op<"recipe_option", [Pure, HasParent<"WeightRecipeOp">]> {
  let summary = "a named integer option of a weight recipe, with its default";
  let description = [{
    The value a `spectra.feature_map` sets for this name in its `options`
    dictionary (an integer), or the default: e.g. the mixture count C of GMM.

    Constraints:
    * C1: the default is at least 1 (options are counts).
    * C2: no other option of the recipe has the same name.

    ```mlir
    %c = spectra.recipe_option "components" default 2 : index
    ```
  }];
  let arguments = (ins StrAttr:$name, I64Attr:$default_value);
  let results = (outs Index:$result);
  let assemblyFormat = "$name `default` $default_value attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Spectra_CeilDivOp : Spectra_Op<"ceil_div", [Pure]> {
  let summary = "ceil(a / b) of two index values (rows per block)";
  let description = [{
    Constraints:
    * C1: a constant divisor is positive.

    ```mlir
    %k = spectra.ceil_div %m, %c
    ```
  }];
  let arguments = (ins Index:$lhs, Index:$rhs);
  let results = (outs Index:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Learnable initialisers and the affine map (learned spectral densities)
//===----------------------------------------------------------------------===//

def Spectra_EyeOp : Spectra_DrawOp<"eye"> {
  let summary = "the n x n identity, e.g. the initial scale of a learned mixture component";
  let description = [{
    Deterministic. With `learnable` it is the initial value of a trainable
    matrix (GMM's Sigma_c).

    Constraints:
    * C1: a constant n is positive; static result dimensions equal it.

    ```mlir
    %s = spectra.eye [%d] learnable : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Index:$size, UnitAttr:$learnable);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "` ` `[` $size `]` (`learnable` $learnable^)? attr-dict `:` type($result)";
}

def Spectra_ZerosOp : Spectra_DrawOp<"zeros"> {
  let summary = "all-zero entries, e.g. the initial mean of a learned mixture component";
  let description = [{
    Deterministic. With `learnable` it is the initial value of a trainable
    tensor (GMM's mu_c).

    Constraints:
    * C1: one size operand per result dimension.
    * C2: a size known as a constant is positive and equals the static result
      dimension, if that is static.

    ```mlir
    %mu = spectra.zeros [%d] learnable : tensor<?xf32>
    ```
  }];
  let arguments = (ins Variadic<Index>:$sizes, UnitAttr:$learnable);
  let results = (outs Spectra_FloatArray:$result);
  let assemblyFormat = "` ` `[` $sizes `]` (`learnable` $learnable^)? attr-dict `:` type($result)";
}

def Spectra_AffineOp : Spectra_Op<"affine", [Pure, AllTypesMatch<["points", "result"]>]> {
  let summary = "row i of the result is A p_i + b: points pushed through an affine map";
  let description = [{
    `P A^T + 1 b^T` for points P (k x d), a square A (d x d) and a shift b (d).
    With P ~ N(0, I) the rows are N(b, A A^T): one Gaussian component of a
    learned spectral density (Kernelized Transformer's GMM, w = Sigma_c n + mu_c).
    Differentiable in A and b, so learnable factors receive gradients.

    Constraints:
    * C1: A is square when its sizes are known.
    * C2: P's columns equal A's columns when both are known.
    * C3: b's length equals A's rows when both are known.

    ```mlir
    %w = spectra.affine %n by %s plus %mu : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32>
    ```
  }];
  let arguments = (ins Spectra_Matrix:$points, Spectra_Matrix:$scale, Spectra_Vector:$shift);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "$points `by` $scale `plus` $shift attr-dict `:` type($points) `,` "
                       "type($scale) `,` type($shift)";
  let hasVerifier = 1;
}

def Spectra_GlorotOp : Spectra_DrawOp<"glorot"> {
  let summary = "a dense layer's weight matrix, Glorot-uniform: U(-a, a), a = sqrt(6 / (rows + cols))";
  let description = [{
    Random (seeded like every draw). With `learnable` it is the initial value
    of a trainable layer weight (a generator network's).

    Constraints:
    * C1: two size operands (rows = outputs, cols = inputs) for the rank-2 result.
    * C2: a size known as a constant is positive and equals the static result
      dimension, if that is static.

    ```mlir
    %w1 = spectra.glorot [%h, %d] learnable : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Variadic<Index>:$sizes, UnitAttr:$learnable);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "` ` `[` $sizes `]` (`learnable` $learnable^)? attr-dict `:` type($result)";
}

def Spectra_LinearOp : Spectra_Op<"linear", [Pure]> {
  let summary = "a dense layer on every row: X W^T + 1 b^T";
  let description = [{
    X is k x i, W is o x i (outputs by inputs), b has length o; the result is
    k x o. Differentiable in W and b.

    Constraints:
    * C1: X's columns equal W's columns when both are known (the layer's input
      width fits).
    * C2: b's length equals W's rows when both are known.
    * C3: the result has X's rows and W's rows where those are known.

    ```mlir
    %y = spectra.linear %x by %w plus %b : tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32> -> tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_Matrix:$input, Spectra_Matrix:$weight, Spectra_Vector:$bias);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "$input `by` $weight `plus` $bias attr-dict `:` type($input) `,` "
                       "type($weight) `,` type($bias) `->` type($result)";
  let hasVerifier = 1;
}

def Spectra_BatchNormOp : Spectra_Op<"batch_norm", [Pure, SameOperandsAndResultType]> {
  let summary = "every column standardised over the rows: (x - mean) / sqrt(var + eps)";
  let description = [{
    Batch normalisation over the batch of generated rows (biased variance,
    eps = 1e-5, no affine part: a following `spectra.linear` supplies it).
    The statistics are those of the current rows, in training and inference
    alike, so W does not depend on the mode.

    Constraints:
    * C1: a static row count is at least 2 (one row has no variance).

    ```mlir
    %n = spectra.batch_norm %y : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins Spectra_Matrix:$input);
  let results = (outs Spectra_Matrix:$result);
  let assemblyFormat = "$input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Spectra_ActivationOp : Spectra_Op<"activation", [Pure, SameOperandsAndResultType]> {
  let summary = "an elementwise activation: leaky_relu (slope 0.01 below 0) or tanh";
  let description = [{
    Constraints:
    * C1: the function is `leaky_relu` or `tanh`.

    ```mlir
    %a = spectra.activation "leaky_relu" %n : tensor<?x?xf32>
    ```
  }];
  let arguments = (ins StrAttr:$function, Spectra_FloatArray:$input);
  let results = (outs Spectra_FloatArray:$result);
  let assemblyFormat = "$function $input attr-dict `:` type($input)";
  let hasVerifier = 1;
}

def Spectra_StackBlocksOp : Spectra_Op<"stack_blocks", [
    SingleBlock]> {
  let summary = "stack independent draws of a block until `rows` rows, then truncate";
  let description = [{
    The body (no arguments) describes one block; it is drawn
    `ceil(rows / block_rows)` times with independent randomness, the blocks are
    stacked vertically and the first `rows` rows kept. If the body also yields
    per-row weights, they are stacked alike; with `average_weights` each copy's
    weights are divided by the number of copies (a quadrature rule averaged
    over independent random rotations stays normalised). Truncating a weighted
    block would break the rule, so with weights the runtime requires `rows` to
    be a multiple of the block rows and says so.

    Constraints:
    * C1: the body yields a rank-2 tensor, optionally followed by a rank-1 tensor.
    * C2: the results have the types of the yielded values.
    * C3: `average_weights` is set only when the body yields weights.

    ```mlir
    %w = spectra.stack_blocks rows %m : tensor<?x?xf32> {
      %g = spectra.gaussian [%d, %d] : tensor<?x?xf32>
      %q = spectra.orthogonalize %g : tensor<?x?xf32>
      spectra.yield %q : tensor<?x?xf32>
    }
    ```
  }];
  let arguments = (ins Index:$rows, UnitAttr:$average_weights);
  let results = (outs Variadic<Spectra_FloatArray>:$results);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat =
      "`rows` $rows (`average_weights` $average_weights^)? attr-dict `:` type($results) $body";
  let hasVerifier = 1;
}

#endif // SPECTRA_DIALECT_WEIGHTOPS_TD
