//===- Passes.td - code generation passes ---------------------------------===//

#ifndef SPECTRA_CODEGEN_PASSES_TD
#define SPECTRA_CODEGEN_PASSES_TD

include "mlir/Pass/PassBase.td"

def SpectraBuildTileKernels : Pass<"spectra-build-tile-kernels", "::mlir::ModuleOp"> {
  let summary = "emit every feature map's fused kernels as linalg on static tiles";
  let description = [{
    For each `spectra.feature_map @f` adds four functions (codegen/TileKernels.h):
    `@f_kv` (S, z and the per-feature key constants over a range of keys),
    `@f_readout` (the outputs, with the query constants and the denominator
    guard), `@f_query_backward` and `@f_key_backward` (built from the
    compiler-derived partials). Each is scf loops over row tiles whose body
    is linalg.generic on static memref tiles: the contractions (L = X W^T,
    S += phi^T V, out = phi S, ...) with a reduction dimension, the
    component's features region and partials as elementwise bodies, the
    stabiliser maxima and the sums as reductions. phi lives in a tile buffer
    of `tile-rows` rows, never in memory of the sequence's size. The kernels
    are specialised on m, d and the value dimension (`value-dim`, 0 = d).

    ```mlir
    // spectra.feature_map @posrf_orf ... gains, besides itself,
    // func.func @posrf_orf_kv(%k: memref<?x32xf32>, ...) attributes {llvm.emit_c_interface}
    //   scf.for %r0 = %c0 to %n step %c32 {
    //     linalg.generic {iterator_types = ["parallel", "parallel", "reduction"]}
    //       ins(%kt, %wt : memref<32x32xf32>, memref<32x128xf32>) outs(%l : memref<32x128xf32>)
    //     ...
    ```
  }];
  let options = [
    Option<"valueDim", "value-dim", "int64_t", /*default=*/"0",
           "value head dimension (0: the feature map's d)">,
    Option<"tileRows", "tile-rows", "int64_t", /*default=*/"32",
           "rows of q or k per tile (with causal, 0: the CPU's choice by the head, "
           "spectra_cpu_causal_tile_rows)">,
    Option<"maxTileRows", "max-tile-rows", "int64_t", /*default=*/"0",
           "when larger than tile-rows: each bidirectional row kernel takes the most rows per "
           "tile, halving from this to tile-rows, whose tiles fit shared-limit bytes">,
    Option<"sharedLimit", "shared-limit", "int64_t", /*default=*/"0",
           "bytes the tile buffers of one row kernel may take (with max-tile-rows)">,
    Option<"dynamicSharedLimit", "dynamic-shared-limit", "int64_t", /*default=*/"0",
           "with shared-limit: a row kernel whose tiles at tile-rows rows exceed it takes the "
           "most rows whose tiles fit this many bytes (dynamic shared memory) before fewer "
           "rows; 0: none">,
    Option<"minTileRows", "min-tile-rows", "int64_t", /*default=*/"0",
           "with shared-limit: a row kernel whose tiles at tile-rows would not fit keeps "
           "halving down to this many rows (0: tile-rows)">,
    Option<"warpChainThreads", "warp-chain-threads", "int64_t", /*default=*/"0",
           "with shared-limit: count a row kernel's bytes as spectra-map-tiles-to-gpu maps "
           "them with this many threads and warp chains (their register tiles out of shared "
           "memory, their partials in); 0: every tile buffer in shared memory">,
    Option<"warpChainMma", "warp-chain-mma", "std::string", /*default=*/"\"bf16\"",
           "with warp-chain-threads: the chains' mma operand type (bf16, bf16x3 or f16)">,
    Option<"inputType", "input-type", "std::string", /*default=*/"\"f32\"",
           "element type of q, k, v, out and their gradients: f32, bf16 or f16">,
    Option<"causal", "causal", "bool", /*default=*/"false",
           "causal attention: the causal kernels (CausalKernels.cpp) instead of the "
           "bidirectional readout and backward">,
    Option<"paramsKernels", "params-kernels", "bool", /*default=*/"false",
           "for components with data statistics, also <map>_moments_params and "
           "<map>_moments_params_backward: the params program from the moments and its "
           "adjoint as per-slice scalar kernels (ParamsKernels.cpp)">,
    Option<"antipodalWeights", "antipodal-weights", "bool", /*default=*/"false",
           "where the weight recipe draws W's rows in blocks of a zero row, P and -P (the "
           "degree-3 sparse grid, the spherical-radial rule; rotated, stacked in whole "
           "blocks): the logits contract P only and the inputs' gradient the differences of "
           "the paired columns (TileBuilder.h, Dims::pairs); the kernels carry "
           "spectra.antipodal_pairs and the runtime checks W against it">,
  ];
  let dependentDialects = ["::mlir::func::FuncDialect", "::mlir::scf::SCFDialect",
                           "::mlir::memref::MemRefDialect", "::mlir::arith::ArithDialect",
                           "::mlir::math::MathDialect", "::mlir::linalg::LinalgDialect",
                           "::mlir::vector::VectorDialect"];
}

def SpectraKeepKernels : Pass<"spectra-keep-kernels", "::mlir::ModuleOp"> {
  let summary = "drop everything but the kernels (before lowering to LLVM or NVVM)";
  let description = [{
    Erases every top-level op that is not a kernel: a `func.func` marked
    `llvm.emit_c_interface` (CPU) or a `gpu.module` (GPU). The feature maps,
    components, recipes and the attention function they came from go, so the
    module lowers alone; module attributes stay.

    ```mlir
    // Before: spectra.component @posrf ..., spectra.feature_map ..., func.func @posrf_orf_kv ...
    // After:  func.func @posrf_orf_kv ...
    ```
  }];
}

def SpectraVectorizeTiles : Pass<"spectra-vectorize-tiles", "::mlir::func::FuncOp"> {
  let summary = "map linalg on static tiles to register-tiled vector code (CPU)";
  let description = [{
    Lowers every linalg.generic and linalg.fill on static memref tiles to
    scf loops of 1-D vector code: contractions to register tiles of
    `register-rows` x `register-vectors` vectors of `vector-width` lanes
    (loop-carried accumulators, one vector.fma per accumulator and k),
    elementwise generics (the component's features region) along their
    innermost dimension with the body cloned on vectors, reductions with
    vector accumulators whose lanes combine as a tree (a reassociating
    vector.reduction for sums, shuffles and maximumf for maxima). A
    contraction into a tile that the linalg.fill just before it set to +0
    (between them no op with memory effects but fills of buffers that cannot
    be the tile's memory; no operand that may be the same memory: a view of
    the buffer, or a function argument marked `spectra.may_alias` as it is)
    starts its accumulators at 0 and only writes the tile; the fill goes.
    An elementwise generic right after a contraction (no op with memory
    effects between) that reads the contraction's output tile element by
    element (the features after the logits), reads nothing else that may be
    that tile and writes nothing that may be the contraction's inputs or
    another view of the tile, runs as its epilogue, on each register tile's
    finished accumulators; the output tile is then stored only if something
    else reads it. An elementwise generic that updates a
    contraction's output tile in place earlier in the block (kv's rescale of
    the summary), with no op between that may touch the tile, writes what the
    update reads or has memory effects other than a linalg op's, runs as its
    prologue, on each register tile's accumulators as they are loaded; where
    the contraction takes another form (AMX, dot products, a tail of columns)
    the update runs on its own at the contraction.
    With `amx`, a contraction of f32 tiles whose M and N are multiples of 16
    and K of 32 runs on AMX tiles instead: each operand split in two bf16
    parts (hi, and the rest rounded), packed (A row-major, B in pairs along
    k; a B the function only reads, once at its entry), three amx.tile_mulf
    per 32 k into each 16 x 16 accumulator tile, which is then stored; its
    epilogue runs as its own loop.
    The CPU pipeline picks the width from the host (8 for AVX2, 16 for
    AVX-512).

    ```mlir
    // linalg.generic (contraction) on memref<32x32xf32>, memref<32x128xf32> -> memref<32x128xf32>
    // becomes scf.for loops around
    //   %acc = scf.for %k ... iter_args(...) { vector.load; vector.broadcast; vector.fma x8 }
    ```
  }];
  let options = [
    Option<"vectorWidth", "vector-width", "int64_t", /*default=*/"8", "f32 lanes per vector">,
    Option<"registerRows", "register-rows", "int64_t", /*default=*/"4",
           "rows of a contraction's register tile">,
    Option<"registerVectors", "register-vectors", "int64_t", /*default=*/"2",
           "vectors per row of a contraction's register tile">,
    Option<"amx", "amx", "bool", /*default=*/"false",
           "contractions of f32 tiles in 16 x 16 blocks, k in steps of 32, on AMX tiles: "
           "each operand split in two bf16 parts, three TDPBF16PS per step (for amx-bf16 hosts)">,
  ];
  let dependentDialects = ["::mlir::vector::VectorDialect", "::mlir::scf::SCFDialect", "::mlir::amx::AMXDialect",
                           "::mlir::memref::MemRefDialect", "::mlir::arith::ArithDialect"];
}

def SpectraStripTiles : Pass<"spectra-strip-tiles", "::mlir::func::FuncOp"> {
  let summary = "run a chain of tile ops one strip of their feature axis at a time, so its tiles stay in L1 (CPU)";
  let description = [{
    A run of linalg ops on buffers (fills and generics, one after another with
    only pure ops between) in which every op has exactly one parallel loop of
    an extent E above `strip` and a multiple of it (the features, m; extents
    tried largest first), and
    every buffer is read or written along one axis of that loop throughout the
    run (or only read, whole), is independent strip by strip: the run becomes
    one scf.for over E / `strip` strips, each op on its strip's subviews.
    A temporary that only the run uses (the logits, the features, the column
    maxima) shrinks to one strip. Runs that hold a reduction-carrying op and at
    least one such temporary are rewritten; others are left as they are.

    The point is the cache: kv's logits, features and summary tiles are 16 KiB
    each at m = 128 and the weights another 16 KiB, which overflows a 32 KiB L1
    between the logits' contraction and the summary's, where one 16-feature
    strip of each is 2 KiB. Runs before spectra-vectorize-tiles, which still
    fuses a fill and an epilogue with their contraction inside the strip, when
    spectra-cpu-pipeline's `strip-features` is set (off by default: on a Zen 3
    core its effect was within the machine's noise; README, issue 23).

    ```mlir
    // linalg.fill, contraction into %l: memref<32x128xf32>, exp into %p, ... (all along m)
    // becomes
    scf.for %j = %c0 to %c128 step %c16 {
      // the same ops on memref<32x16xf32> strips, %l and %p one strip each
    }
    ```
  }];
  let options = [
    Option<"strip", "strip", "int64_t", /*default=*/"16", "features per strip">,
  ];
  let dependentDialects = ["::mlir::scf::SCFDialect", "::mlir::memref::MemRefDialect",
                           "::mlir::arith::ArithDialect"];
}

def SpectraFullTilesInPlace : Pass<"spectra-full-tiles-in-place", "::mlir::func::FuncOp"> {
  let summary = "full row tiles read and write the kernel arguments' rows in place, not through staged copies (CPU)";
  let description = [{
    The tile kernels stage each row tile: its rows copied into a [T, W]
    buffer (zeros below the last row), worked on whole, its results copied
    out. Only a slice's last tile can be short, and in kernels that do little
    per element (the statistics' moments and their backward) the fills and
    copies are most of the work. For a tile loop without a contraction, the
    body runs under `scf.if rows == T`: the full tile reads the argument's
    rows through a [T, W] view where the staged buffer was only read, and
    writes them the same way where the buffer was written once by an
    elementwise op (or a fill) and then unstaged; the short tile keeps the
    staged body.

    Two arguments marked `spectra.may_alias` may be the same memory (dx may be
    dxin), so an argument is read in place only where every read of it comes
    before the first write to its memory (through it or an argument that may
    be it), or is that write's own element-for-element read (identity maps),
    as in the staged body; and a buffer is written in place only where nothing
    between its writer and its copy-out reads or writes its argument's memory.
    Loops with a contraction (a linalg op of three or more loops) are left as
    they are: there the copies weigh little, and the doubled body costs compile
    time.

    ```mlir
    scf.for %r0 = %c0 to %n step %c32 {      // spectra.tile_loop
      %rows = arith.minsi %left, %c32 : index
      linalg.fill ins(%zero : f32) outs(%xt : memref<32x32xf32>)
      scf.for %i = %c0 to %rows step %c1 { /* row r0 + i of %x into row i of %xt */ }
      linalg.generic ins(%xt ...) outs(%sum ...)   // reads %xt
    }
    // becomes
    scf.for %r0 = %c0 to %n step %c32 {
      %rows = arith.minsi %left, %c32 : index
      scf.if %rows == 32 {
        %v = memref.subview %x[%r0, 0] [32, 32] [1, 1]
        linalg.generic ins(%v ...) outs(%sum ...)
      } else { /* as before */ }
    }
    ```
  }];
  let dependentDialects = ["::mlir::scf::SCFDialect", "::mlir::memref::MemRefDialect",
                           "::mlir::arith::ArithDialect"];
}

def SpectraHoistColumnTerms : Pass<"spectra-hoist-column-terms", "::mlir::func::FuncOp"> {
  let summary = "a tile op's sum of terms that depend on the column alone is computed once, before the tile loop (CPU)";
  let description = [{
    A component's exponent is a sum of terms over a tile's [T, M] elements,
    some of which depend on the feature (the column) alone: OPRF's
    a0 ||w_j||^2 and a2, the stabiliser's per-feature constant c_j. For an
    all-parallel 2-D linalg.generic in a tile loop (outputs by the identity
    map), each maximal chain of addf/subf in its payload is a signed sum of
    terms; a value defined above the tile loop, or a term the payload computes
    (arith, math) from inputs indexed by the column alone that nothing in the
    tile loop writes, constants and such values, with at least one of the
    inputs or constants, is a column term. Where a chain has two or more and other
    terms besides, the column terms are summed in their order by a 1-D generic
    into an [M] stack buffer before the tile loop, and the chain becomes its
    other terms, in their order, plus that buffer (a new column input of the
    op, which drops the inputs it no longer reads). The sum is reassociated (f32 results differ from the chain's order by
    a few ulps).

    ```mlir
    linalg.generic ins(%l, %xx, %ww, %c : [T,M], [T], [M], [M]) ... {
      %0 = a0 * ww ; %1 = a1 * l ; %2 = %0 + %1 ; %3 = %2 - xx ; %4 = %3 + a2 ; %5 = %4 + c
    }
    // becomes, before the tile loop: %col[j] = a0 * ww[j] + a2 + c[j]; in the op:
    //   %1 = a1 * l ; %3 = %1 - xx ; %5 = %3 + col
    ```
  }];
  let dependentDialects = ["::mlir::memref::MemRefDialect", "::mlir::arith::ArithDialect",
                           "::mlir::linalg::LinalgDialect"];
}

def SpectraReuseTileBuffers : Pass<"spectra-reuse-tile-buffers", "::mlir::func::FuncOp"> {
  let summary = "an elementwise op writes its output tile over an input tile it is the last to read (CPU)";
  let description = [{
    The tile kernels give every tile its own buffer. kv's logits and its
    features phi = exp(l - c) are two [T x m] tiles (16 KiB each at T = 32,
    m = 128); with the weights, the summary and the staged rows the tile's
    working set overflows L1, while the logits are dead once phi is formed.
    In a tile loop's body, an all-parallel linalg.generic G with an input A
    and an output B, both by the identity map and stack allocations of one
    type, writes B over A where every use of A and B (through views too) is
    in the body and none passes the buffer on (a yield, a memref result that
    is no view), A is not used after G and its first use in the body writes
    it whole (a fill, or an all-parallel generic with A an output by the
    identity map whose payload does not read it, and no input in A), B's first
    use is G, which writes it whole, and no other operand of G is A, B or a
    view of either. Every use of B then becomes a use of A. The GPU schedule keeps both (a warp chain holds them in
    registers, and it matches distinct buffers).

    ```mlir
    scf.for %r0 = ... {                       // spectra.tile_loop
      linalg.generic ins(...) outs(%l : memref<32x128xf32>)    // writes %l whole
      linalg.generic ins(%l ...) outs(%cmax ...)                // reads %l
      linalg.generic ins(%l, %c ...) outs(%phi : memref<32x128xf32>) { exp }
      linalg.generic ins(%phi, %v ...) outs(%S ...)             // reads %phi
    }
    // becomes: the exp's outs(%l ...), the contraction's ins(%l, %v ...), %phi gone
    ```
  }];
  let dependentDialects = ["::mlir::memref::MemRefDialect"];
}

def SpectraPolynomialExp : Pass<"spectra-polynomial-exp"> {
  let summary = "replace math.exp by its polynomial approximation (vectorisable, no libm call)";
  let description = [{
    The CPU kernels spend much of their time in `exp`; lowered as a libm call
    it is scalar and opaque to the loop vectoriser. This pass applies MLIR's
    polynomial approximation of `math.exp` (arith ops only, within a few ulp
    in f32), run by spectra-cpu-lowering before the conversion to LLVM. Three forms:

    - With `scalef` (AVX-512 hosts), a 16-lane exp forms z 2^n with one vscalefps
      (its zero mask flushes results below 2^-126) instead of clamping n,
      converting it and building 2^n from its bits; P(a) is of degree 4: 14
      vector instructions where the generic form takes 20.
    - An exp marked `spectra.exp_at_most_zero` (a stabilised argument: a logit
      less a constant at least as large, so at most 0 or NaN) needs no overflow
      clamp: 13 instructions with vscalefps; without it (8-lane AVX2 code,
      tails) the magic-constant form, n rounded by adding 1.5 2^23 + 127 and
      2^n = bits << 23, 0 selected below -87.336: 15 instructions. With `table`
      (AVX2 hosts), a marked 8-lane exp rounds k = 8 x log2e instead and takes
      2^(k/8) = 2^n 2^(j/8) from an 8-entry table by vpermd, its remainder a
      quarter as wide, so P is of degree 1: 13 instructions, a shorter chain.
      With `table` and `scalef` (AVX-512 hosts), a marked 16-lane exp takes the
      same form with k = 16 x log2e and a 16-entry table (the zmm vpermd) in
      place of vscalefps: fewer operations on the FMA pipes, a shorter chain.
    - Any other exp takes MLIR's generic approximation.

    Where the exp's only use multiplies it by a coefficient s, s folds into the
    polynomial's last step (fma(p, s, s)).

    ```mlir
    %e = math.exp %x : f32   // becomes arith.mulf/addf/... and a bitcast
    ```
  }];
  let options = [
    Option<"scalef", "scalef", "bool", /*default=*/"false",
           "exp of vector<16xf32> with AVX-512's vscalefps (z 2^n in one instruction, "
           "results below 2^-126 flushed to 0 by its zero mask): for hosts with avx512f">,
    Option<"table", "table", "bool", /*default=*/"false",
           "stabilised exp of vector<8xf32> with AVX2's vpermd: 2^(k/8) from an 8-entry "
           "table and a degree-3 polynomial (13 instructions, 8 of them FMAs or multiplies): "
           "for hosts with avx2; with scalef as well, vector<16xf32> from a 16-entry table">
  ];
  // The approximation of a vector exp builds vector constants (vector.broadcast); the
  // AVX-512 form calls an LLVM intrinsic.
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect",
                           "::mlir::vector::VectorDialect", "::mlir::LLVM::LLVMDialect"];
}

def SpectraSelectMaxima : Pass<"spectra-select-maxima"> {
  let summary = "arith.maximumf/minimumf as compare and select: one vmaxps/vminps on x86";
  let description = [{
    `arith.maximumf` is IEEE 754-2019 maximum: NaN from either operand, and -0 < +0.
    x86 before AVX10.2 has no such instruction, and LLVM expands each one to six
    (sign test, two blends, unordered compare, max, masked move); in the stabiliser's
    column maxima of the kv kernel, a chain carried across the tile's rows, that took
    7% of the kernel. The CPU kernels use maxima only as stabilisers (the largest
    logit of a row or feature), where neither rule matters: the runtime refuses
    non-finite q, k and v, and a NaN logit that arises anyway still makes its
    feature NaN through exp(l - c), because the kernels select phi on `l != -inf`
    (unordered: NaN counts as live), not on `l > -inf`; the sign of a zero
    constant changes nothing. The GPU emulation (`gpu-emulated`) keeps
    maximumf, as the GPU's max.NaN.f32 propagates NaN. This pass rewrites `maximumf(a, b)` to
    `select(cmpf ogt a, b, a, b)` (and minimumf with olt), the exact form of x86's
    maxps/minps, run by spectra-cpu-lowering only: the GPU kernels keep
    `max.NaN.f32`, one instruction there.

    ```mlir
    %m = arith.maximumf %a, %b : vector<16xf32>
    // becomes
    %gt = arith.cmpf ogt, %a, %b : vector<16xf32>
    %m = arith.select %gt, %a, %b : vector<16xi1>, vector<16xf32>
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect"];
}

def SpectraShortenChains : Pass<"spectra-shorten-chains"> {
  let summary = "a tile element's sum with row and column terms, the element added last (CPU)";
  let description = [{
    The tile bodies between the contractions add row terms (a broadcast scalar:
    a stabiliser, a norm) and column terms (a vector from a rank-1 buffer: a
    feature's offset) to each element of a tile, e.g. PosRF's exponent
    `((l - 0.5 n) + c) - m`. Written so, each element waits on three dependent
    operations before its exp, and the epilogues after a contraction are bound
    by those chains' latency (README issue 23). This pass reassociates
    `(x +- a) +- b`, where `x` varies along both axes and `a`, `b` along fewer,
    to `x +- (a +- b)`; the rows' terms then combine with each other first, and
    CSE leaves one such combination per row of a register tile:

    ```mlir
    %0 = arith.subf %l, %half_n : vector<8xf32>
    %1 = arith.addf %0, %c : vector<8xf32>
    %2 = arith.subf %1, %m : vector<8xf32>
    // becomes
    %hm = arith.addf %m, %half_n : vector<8xf32>
    %t = arith.subf %c, %hm : vector<8xf32>
    %2 = arith.addf %l, %t : vector<8xf32>
    ```

    The sum is rounded in another order: a change of an ulp of its largest term.
    Run in spectra-cpu-pipeline's vector stage before the canonicalizer and CSE
    (which share the rows' terms between a register tile's vectors).
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::vector::VectorDialect"];
}

def SpectraFormFma : Pass<"spectra-form-fma"> {
  let summary = "a vector multiply and the add of its product as one math.fma (CPU)";
  let description = [{
    In the tile bodies between the contractions (the features, the stabiliser, the
    backward chains), `a * b + c` written as an arith.mulf whose only use is an
    arith.addf becomes one `math.fma` (one rounding). On a CPU whose 512-bit
    operations all issue on the FMA ports, each such pair cost two of those
    ports' cycles. `a * b - c` and `c - a * b` fuse too, as an fma with a
    negated operand (a negated constant, or an arith.negf that the fma absorbs:
    x86's vfmsub and vfnmadd, AArch64's fmls, are one instruction). Vectors
    only; LLVM would not fuse them itself (no `contract` flag). Run at the end
    of spectra-cpu-pipeline's vector stage (so
    `spectra-compile --emit=work` counts the result); the GPU pipeline and its
    emulation keep each operation as written.

    ```mlir
    %p = arith.mulf %a, %b : vector<16xf32>
    %s = arith.addf %p, %c : vector<16xf32>
    // becomes
    %s = math.fma %a, %b, %c : vector<16xf32>
    ```
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect", "::mlir::math::MathDialect"];
}

def SpectraPackTileBuffers : Pass<"spectra-pack-tile-buffers", "::mlir::LLVM::LLVMFuncOp"> {
  let summary = "place a CPU kernel's tile buffers in one stack arena, each at its own offset modulo 4 KiB";
  let description = [{
    A kernel's tile buffers are stack allocations whose sizes are multiples of
    4 KiB ([32 x 128] f32 is 16 KiB). Laid out one after another, element j of
    every buffer sits at the same address modulo 4096, and a loop that reads
    one buffer while it writes another at the same index has every load wait
    on an unrelated store (the core's store-to-load check compares the low 12
    address bits: "4K aliasing"); the lines also share one L1 set. Measured on
    an AMD Zen 4: saderf-orf's query_backward, whose elementwise loop reads 10
    tiles and writes 9, 26.3 ms -> 21.2 ms.

    This pass replaces the entry block's constant-size allocas of at least 256
    bytes by offsets into one 64-byte-aligned `i8` arena, buffer i starting at
    (i * spacing) mod 4096 with spacing = 4096 / count (a multiple of 64), so
    no two buffers share an offset modulo 4 KiB. Runs last in
    spectra-cpu-lowering.

    ```mlir
    %a = llvm.alloca %c4096 x f32 : (i64) -> !llvm.ptr
    %b = llvm.alloca %c4096 x f32 : (i64) -> !llvm.ptr
    // becomes
    %arena = llvm.alloca %c34816 x i8 {alignment = 64 : i64} : (i64) -> !llvm.ptr
    %a = llvm.getelementptr %arena[0] : (!llvm.ptr) -> !llvm.ptr, i8
    %b = llvm.getelementptr %arena[18432] : (!llvm.ptr) -> !llvm.ptr, i8
    ```
  }];
}

def SpectraMapTilesToGpu : Pass<"spectra-map-tiles-to-gpu", "::mlir::ModuleOp"> {
  let summary = "schedule the tile kernels for a GPU: blocks, thread nests, workgroup tiles";
  let description = [{
    The GPU schedule of the one kernel layer (codegen/MapTilesToGpu.cpp). Each
    tile kernel (a function with the kernel ABI attributes of TileKernels.h)
    takes its arguments batched by role (rows [BH, N, ...], masks [BH, N],
    slices [BH, ...], partial sums [BH, C, ...]) and becomes one scf.forall
    over blocks mapped to #gpu.block (a block per (row chunk of `chunk-rows`
    rows, slice), per slice, or one), whose body is the tile kernel on the
    block's windows. Tile buffers move to workgroup memory; every linalg op
    becomes a thread nest (scf.forall mapped to #gpu.thread<x>: a
    block-stride loop over its parallel iterations, reductions sequential in a
    thread) and scalar stores a one-thread nest. Straight-line vector code at
    block level (the params kernels) is first spread over threads: each run of
    elementwise vector ops one linalg.generic over the vector's entries, the
    values later code reads in workgroup tiles, each vector.reduction <add> a
    one-thread reduction every thread reads back. With `mma-type` the
    contractions become warp nests (#gpu.warp<x>) of 16 x 8 tiles marked
    spectra.mma instead (MapContractionsToMma.h). No atomics: row chunks write
    their own partials, which the combine kernels merge in chunk order.
    Kernels needing more workgroup memory than `shared-limit` are refused.

    ```mlir
    // func.func @posrf_orf_kv(%k: memref<?x?x32xf32>, ..., %S: memref<?x?x128x32xf32>, ...)
    //   scf.forall (%chunk, %bh) in (%C, %BH) {
    //     %kt = memref.alloca() : memref<8x32xf32, #gpu.address_space<workgroup>>
    //     scf.forall (%t) in (256) { scf.for ... linalg.generic ... }
    //       {mapping = [#gpu.thread<x>]}
    //   } {mapping = [#gpu.block<x>, #gpu.block<y>]}
    ```
  }];
  let options = [
    Option<"threads", "threads", "int64_t", /*default=*/"256", "threads per block">,
    Option<"chunkRows", "chunk-rows", "int64_t", /*default=*/"256",
           "rows of q or k per block">,
    Option<"partialChunks", "partial-chunks", "bool", /*default=*/"false",
           "a row kernel with partial sums takes its chunk count C from them (their second "
           "dimension: the host sizes them) and covers ceil(N / C) rows per block, rounded "
           "up to its tile rows, instead of chunk-rows: fewer, longer chunks where a long "
           "sequence would write one partial per chunk-rows rows (spectra.chunks = "
           "\"partials\")">,
    Option<"sharedLimit", "shared-limit", "int64_t", /*default=*/"49152",
           "bytes of shared memory a block may use (spectra-launch-mapped-kernels takes the "
           "buffers from one pool of dynamic shared memory; past 48 KiB the runtime opts in)">,
    Option<"mmaType", "mma-type", "std::string", /*default=*/"\"\"",
           "the contractions on tensor cores, as warp nests of 16 x 8 tiles "
           "(MapContractionsToMma.h): bf16 or f16 (operands rounded), bf16x3 (operands "
           "split in two bf16 parts, three mma); empty: every contraction a thread nest">,
    Option<"warpChains", "warp-chains", "bool", /*default=*/"true",
           "with mma-type: a contraction, its epilogue and the ops that read the tiles it "
           "forms (the features, their row maximum, the exponential, the next contraction) "
           "as one warp nest with those tiles in registers (WarpChains.h); false: each "
           "contraction its own warp nest, the tiles in shared memory">,
    Option<"rowNests", "row-nests", "bool", /*default=*/"true",
           "a partial tile's loops over its rows (the loads of q, k, v and the mask, the "
           "stores of output rows), where the rows are independent, as one thread nest over "
           "rows x elements (RowLoopNests.h); false: a thread nest and a barrier per row">,
    Option<"mergeNests", "merge-nests", "bool", /*default=*/"true",
           "a block's nests in phases of independent nests, a phase's thread nests as one "
           "nest, one barrier (MergeNests.h); false: a barrier after every nest">,
  ];
  let dependentDialects = ["::mlir::gpu::GPUDialect", "::mlir::scf::SCFDialect",
                           "::mlir::memref::MemRefDialect", "::mlir::arith::ArithDialect",
                           "::mlir::linalg::LinalgDialect"];
}

def SpectraRowLoopNests : Pass<"spectra-row-loop-nests", "::mlir::ModuleOp"> {
  let summary = "a partial tile's loops over independent rows as one thread nest each";
  let description = [{
    What spectra-map-tiles-to-gpu runs on every kernel's mapped IR
    (RowLoopNests.h), on its own: every scf.for whose body is one thread nest
    (spectra.thread_nest) and ops free of memory effects, and every one-thread
    nest holding one such loop of scalar work, becomes one thread nest over
    (row, element) pairs where the rows are independent: each iteration writes
    only its own row (a subview at offset iv, or iv plus a value from outside
    the loop, size 1, of a buffer from outside it; or a scalar store indexed
    so), and reads a buffer the loop writes only in that row of the same view.
    Other loops are left as they are. The loop's rows need a constant bound
    (its upper bound, or the min of one and a value); a loop over the rows past
    the end of a partial tile (from min(x, C) to C) is left too: it runs in the
    last tile only.

    Then (columns=true) a loop whose rows depend on each other, its body one
    thread nest in which each thread keeps to a column of its own of every
    buffer the loop writes (the same offset along the last dimension, the
    thread's index, in every access), becomes one nest whose threads each run
    the rows in order: a running maximum down a tile's rows takes one barrier,
    not one per row.

    ```mlir
    // scf.for %r = %c0 to %rows step %c1 {          // %rows = min(%n, 16)
    //   scf.forall (%t) in (32) { row %r, element %t } {spectra.thread_nest}
    // }
    // ->
    // scf.forall (%t) in (256) {
    //   scf.for %r = %t / 32 to %rows step 8 { row %r, element %t mod 32 }
    // } {spectra.thread_nest}
    ```
  }];
  let options = [
    Option<"threads", "threads", "int64_t", /*default=*/"256", "threads per block">,
    Option<"columns", "columns", "bool", /*default=*/"true",
           "also run the rows of a loop whose body is one thread nest, each thread in a "
           "column of its own (a running maximum down the rows), inside one nest: the "
           "rows in order in each thread (runRowsInThreads)">,
  ];
  let dependentDialects = ["::mlir::scf::SCFDialect", "::mlir::arith::ArithDialect",
                           "::mlir::gpu::GPUDialect"];
}

def SpectraMergeNests : Pass<"spectra-merge-nests", "::mlir::ModuleOp"> {
  let summary = "a block's nests in phases, independent thread nests as one nest (one barrier)";
  let description = [{
    What spectra-map-tiles-to-gpu runs last on a mapped kernel (MergeNests.h), on
    its own: in every block, a run of nests (spectra.thread_nest, over threads or
    warps) with only ops free of memory effects between them is scheduled into
    phases. Two nests conflict where one writes a buffer the other reads or
    writes; buffers are told apart by their roots under the views (an alloca, a
    kernel argument; two arguments marked `spectra.may_alias` count as one), and
    a nest with an effect on anything else ends the run. A
    nest goes to the first phase after those of the nests it conflicts with, so it
    moves above nests it is independent of; where both keep each thread to a
    column of its own of the buffers they share (the same offset from the thread's
    index along the last dimension), the later may share the earlier's phase. A
    phase's thread nests become one nest with the most threads of its members;
    each member's body runs in its own threads (a guard where it has fewer). A warp nest joins a phase unmerged,
    with no barrier before the next nest of its phase (spectra.no_barrier), and so
    does a guarded nest (an scf.if holding one nest, as the learnable-W switch
    around dW), the guard moving with it; no two
    nests of a phase reduce over a common buffer. On the GPU each nest ends with a
    barrier (unless marked): one barrier per phase.

    ```mlir
    // scf.forall (%t) in (256) { q rows -> Qt }  {spectra.thread_nest}
    // scf.forall (%t) in (256) { k rows -> Kt }  {spectra.thread_nest}
    // scf.forall (%t) in (16)  { mask -> kept }  {spectra.thread_nest}
    // ->
    // scf.forall (%t) in (256) {
    //   q rows -> Qt;  k rows -> Kt;  scf.if %t < 16 { mask -> kept }
    // } {spectra.thread_nest}
    ```
  }];
  let options = [
    Option<"threads", "threads", "int64_t", /*default=*/"256", "threads per block">,
  ];
  let dependentDialects = ["::mlir::scf::SCFDialect", "::mlir::arith::ArithDialect",
                           "::mlir::gpu::GPUDialect"];
}

def SpectraStripWorkgroupMemory : Pass<"spectra-strip-workgroup-memory", "::mlir::ModuleOp"> {
  let summary = "erase #gpu.address_space<workgroup> from every type (gpu-emulated on the CPU)";
  let description = [{
    The CPU has one memory: a block's workgroup tiles become ordinary stack
    buffers of the block's loop iteration, which is faithful because every
    tile is written before it is read within a block.

    ```mlir
    // memref<8x128xf32, #gpu.address_space<workgroup>>  ->  memref<8x128xf32>
    ```
  }];
}

def SpectraExpandBf16 : Pass<"spectra-expand-bf16", "::mlir::ModuleOp"> {
  let summary = "bf16 conversions as integer arithmetic (gpu-emulated on the CPU)";
  let description = [{
    `arith.truncf` to bf16 and `arith.extf` from it become integer arithmetic on
    the f32 bits (round to nearest even, NaN kept a NaN), the rounding of the
    GPU's cvt.rn.bf16.f32. Without it LLVM lowers the truncation to a call of
    `__truncsfbf2` on a CPU without AVX512-BF16 (an AVX2 host), a symbol the
    JIT does not find. Only the bf16 patterns of upstream's arith expansion are
    applied; every other op is left as it is.

    ```mlir
    %h = arith.truncf %x : vector<8xf32> to vector<8xbf16>
    // -> arith.bitcast to i32, the rounding bias added, arith.shrui by 16,
    //    arith.trunci to i16, arith.bitcast to bf16 (a NaN selected apart)
    ```
  }];
}

def SpectraEmulateWarpMma : Pass<"spectra-emulate-warp-mma", "::mlir::ModuleOp"> {
  let summary = "the tensor-core tiles of the mapped kernels, lane by lane on the CPU";
  let description = [{
    Part of gpu-emulated: each contraction tile marked spectra.mma (a warp's
    16 x 8 tile, MapContractionsToMma.h) becomes what the GPU lowering emits
    for it, run lane by lane: the 32 lanes' A, B and accumulator fragments,
    built by the same lane maps, stored in a per-warp register file in memory,
    and a model of mma.sync (m16n8k16 or m16n8k8) that reads each operand
    element from the lane and register the PTX ISA's fragment tables assign
    it. Without this pass the tile runs as the linalg op it is (the same
    numbers, when the lane maps are right).

    ```mlir
    // linalg.generic ... attrs = {spectra.mma = {..., k_step = 8, split = true, type = bf16}}
    //   ->  scf.for %lane = 0 to 32 { fragments } ; the ISA's mma on the register file ; ...
    ```
  }];
  let dependentDialects = ["::mlir::scf::SCFDialect", "::mlir::memref::MemRefDialect",
                           "::mlir::arith::ArithDialect"];
}

def SpectraLaunchMappedKernels : Pass<"spectra-launch-mapped-kernels", "::mlir::ModuleOp"> {
  let summary = "mapped kernels to gpu.launch: block ids, predicated thread nests, barriers";
  let description = [{
    The GPU path from the mapped IR: the block forall becomes gpu.launch
    (grid = its bounds, block = the kernel's threads, workgroup tiles, then
    the warp chains' partials, as memref.views at 16-byte aligned offsets of
    one pool, the block's dynamic shared memory, whose bytes the launch
    carries); each thread nest runs
    under `tid.x < n` and is followed by gpu.barrier; a warp nest runs warp
    `tid.x / 32` under `tid.x / 32 < n`, its spectra.mma tiles lowered to lane
    fragments and nvvm.mma.sync.

    ```mlir
    // gpu.launch blocks(%bx, %by, %bz) in (%gx = %C, %gy = %BH, %gz = %c1)
    //            threads(%tx, %ty, %tz) in (%sx = %c256, %sy = %c1, %sz = %c1)
    //            dynamic_shared_memory_size %bytes {
    //   %pool = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
    //   %kt = memref.view %pool[%c0][] : ... to memref<8x32xf32, #gpu.address_space<workgroup>>
    //   scf.if (%tx < 32) { ... }  gpu.barrier  ...
    ```
  }];
  let dependentDialects = ["::mlir::gpu::GPUDialect", "::mlir::scf::SCFDialect",
                           "::mlir::NVVM::NVVMDialect", "::mlir::LLVM::LLVMDialect",
                           "::mlir::arith::ArithDialect", "::mlir::memref::MemRefDialect"];
}

def SpectraDescribeGpuKernels : Pass<"spectra-describe-gpu-kernels", "::mlir::ModuleOp"> {
  let summary = "join the outlined kernels into one gpu.module and record their launch description";
  let description = [{
    After gpu-kernel-outlining: every kernel moves into one gpu.module (one
    PTX text) under its host function's name, and the launch description is
    read off the host functions' gpu.launch_func ops (kernel, grid rule,
    threads, shared bytes, each argument's name, role, rank and element
    type) into the module attribute `spectra.gpu_kernels` (JSON): the kernel
    ABI the runtimes launch from, generated rather than restated.

    ```mlir
    // module attributes {spectra.gpu_kernels = "(JSON: per kernel kind, grid, block, args)"} {
    //   gpu.module @spectra_kernels { gpu.func @posrf_orf_kv(...) kernel ... }
    ```
  }];
  let options = [
    Option<"moduleName", "module-name", "std::string", /*default=*/"\"spectra_kernels\"",
           "name of the joined gpu.module">,
  ];
  let dependentDialects = ["::mlir::gpu::GPUDialect"];
}

#endif // SPECTRA_CODEGEN_PASSES_TD
