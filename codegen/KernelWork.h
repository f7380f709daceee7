//===- KernelWork.h - the vector work of a CPU kernel per row tile ---------===//
//
// What a CPU kernel issues per tile of q or k rows, counted on the vector stage of
// spectra-cpu-pipeline (register-tiled vector code, before the exponential is expanded and
// before LLVM): the contractions' vector FMAs, the exponentials, every other vector
// operation (the features, the stabiliser, the masks, the row and column reductions), and
// the vector loads and stores. From these, the share of the FMA peak a kernel could reach
// if every vector operation issued on the FMA ports (as 512-bit operations do on Intel
// cores): the bound the benchmark prints beside each kernel's measured share.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_KERNELWORK_H
#define SPECTRA_CODEGEN_KERNELWORK_H

#include "mlir/IR/BuiltinOps.h"

#include <string>
#include <vector>

namespace mlir::spectra {

/// Vector operations of one kernel per tile of `tileRows` rows. Loops with constant bounds
/// count their trip count; a loop over the rows left in the tile (`min(rows left, tile)`)
/// counts a full tile. Work under an `scf.if` on the kernel's `wgrad` argument (the weights'
/// gradient, only when W is learnable) is counted apart, in `conditional`; under any other
/// `scf.if` (a test on the data, in the causal kernels) the then-branch is counted as taken
/// and `exact` is cleared.
struct KernelWork {
  struct Counts {
    double fmas = 0;   // vector.fma: the contractions' multiply-adds
    double exps = 0;   // math.exp on vectors
    double other = 0;  // every other vector arithmetic, compare, select, shuffle, reduction
    double loads = 0;  // vector loads, and broadcasts of a scalar loaded from memory
    double stores = 0; // vector stores
    Counts &operator+=(const Counts &o);
  };
  std::string kind; // kv, readout, query_backward, ...
  int64_t tileRows = 0;
  int64_t width = 0; // f32 lanes of the widest vector
  Counts always;
  Counts conditional;
  /// Every loop's trip count known and no branch on the data (otherwise the counts are
  /// estimates).
  bool exact = true;
  /// The kernel's spectra.antipodal_pairs (TileKernels.h): W's rows in blocks of a zero row,
  /// this many rows P, then -P, of which the logits and the inputs' gradient contract only P.
  /// 0: W dense.
  int64_t antipodalPairs = 0;
};

/// The exp forms the CPU lowering picks (spectra-polynomial-exp's options): `scalef`, 16-lane
/// exps with vscalefps (avx512f hosts); `table`, stabilised 8-lane exps with vpermd (avx2), and
/// with `scalef` stabilised 16-lane ones from a 16-entry table.
struct ExpForms {
  bool scalef = false;
  bool table = false;
};

/// The kernels of a module at the vector stage with a row-tile loop (spectra.tile_rows).
/// With `forms.scalef` the 16-lane exps take spectra-polynomial-exp's vscalefps form, which
/// folds an exp's coefficient multiply (expScaledBy) into it, so that multiply is not counted
/// (nor after a stabilised exp, kExpAtMostZeroAttr, whose forms fold it, except the table
/// form of `forms.table`, 8 lanes or with `forms.scalef` 16, where it stays an instruction).
/// Exps are counted as stabilised ones; each unmarked exp adds `unmarkedExtra` operations to
/// other.
std::vector<KernelWork> countKernelWork(ModuleOp vectors, ExpForms forms, int64_t unmarkedExtra);

/// The vector operations one math.exp on vector<width x f32> becomes in the CPU lowering
/// (spectra-polynomial-exp with `forms`), counted by running that pass; with `atMostZero`,
/// an exp marked as stabilised (kExpAtMostZeroAttr).
int64_t expVectorOps(MLIRContext *context, int64_t width, ExpForms forms, bool atMostZero);

/// The share of the FMA peak `c` allows if every vector operation takes an FMA port's
/// cycle: fmas / (fmas + exps x expOps + other).
double fmaPortBound(const KernelWork::Counts &c, int64_t expOps);

/// One line per kernel: "KIND tile_rows=.. width=.. fma=.. exp=.. exp_ops=.. other=..
/// load=.. store=.. if_fma=.. if_exp=.. if_other=.. if_load=.. if_store=.. bound=..
/// if_bound=.. exact=0|1" (counts per tile; bounds as fractions of the FMA peak).
std::string formatKernelWork(const std::vector<KernelWork> &work, int64_t expOps);

/// formatKernelWork of a module at the vector stage compiled at `width` lanes for this host:
/// the exp lowering the JIT would pick (vscalefps at 16 lanes on avx512f hosts, the table form
/// at 8 lanes on avx2 hosts) counted and
/// applied to the counts.
std::string hostKernelWork(ModuleOp vectors, int64_t width);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_KERNELWORK_H
