//===- Epilogue.h - contraction epilogues, for both schedules -------------===//
//
// A tile contraction C[m, n] += A B is often followed at once by an elementwise
// generic that reads C element by element: the features after the logits. Both
// schedules run that generic as the contraction's epilogue, on the finished
// accumulators, decided here once on the target-free tile kernels:
//  - CPU (VectorizeTiles.cpp): on each register tile's accumulator vectors;
//  - GPU (MapContractionsToMma.h): on each warp tile's accumulator fragment, lane
//    by lane (the four elements a lane holds), emulated the same way on the CPU.
// C is then stored only where something else reads it. A contraction whose output a fill
// just set to 0 starts its accumulators at 0 instead (zeroFillBefore).
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_EPILOGUE_H
#define SPECTRA_CODEGEN_EPILOGUE_H

#include "mlir/Dialect/Linalg/IR/Linalg.h"

#include <optional>

namespace mlir::spectra {

/// A contraction's epilogue: the generic, its input that reads C, and whether C must still
/// be stored (something other than the contraction and the epilogue reads its buffer).
struct Epilogue {
  linalg::GenericOp op;
  unsigned input = 0;
  bool storeOutput = true;
};

/// The buffer a view is of (through subviews and casts; a memref.view of a byte pool is a
/// buffer of its own).
Value viewRoot(Value view);

/// Whether buffers x and y may be the same memory: views of one buffer, or of two arguments
/// of one function, of one type, both marked spectra.may_alias (kMayAliasArgAttr in
/// SpectraDialect.h: an in-place call's pair, such as moments_backward's dx and dxin, taken to
/// be the same memory element for element, not offset views of one buffer). Other
/// arguments are distinct memory.
bool mayAlias(Value x, Value y);

/// Whether `op`, with what it holds, may write the memory of `buffer` (or, with `reads`, also
/// read it): by its memory effects, on any value that mayAlias `buffer`; an effect on no named
/// value, or an op without effect information, counts as touching every buffer.
bool mayTouch(Operation *op, Value buffer, bool reads);

/// The output C of a generic over (m, n, k) with one output, indexed (m, n): a tile
/// contraction's (its inputs and payload not checked); null otherwise.
Value contractionOutput(linalg::GenericOp op);

/// Whether `tile` (a view of a local buffer) is read by anything other than `writer` and
/// `reader` (fills only write; views are followed to their users). True for a buffer that
/// is not a local alloca (an argument: the caller may read it).
bool readElsewhere(Value tile, Operation *writer, Operation *reader);

/// Whether a 2-D elementwise generic can run on a contraction tile's accumulators (as its
/// epilogue, or on the CPU its prologue): a body of arith and math on scalars, and every
/// operand indexed by loop dims with the column dim innermost wherever it appears (vectors
/// run along the columns).
bool runsOnAccumulators(linalg::GenericOp e);

/// The epilogue of a contraction C[m, n] += A B (2 inputs, output indexed (m, n)): the next
/// op with memory effects, when it is an all-parallel 2-D generic over C's shape that reads
/// C itself (identity map) once, whose outputs are written element by element (identity
/// maps), may not be A or B (mayAlias) and are C or miss it (another buffer, or a subview
/// of C's source beside C's), whose other inputs may not be C's memory, whose operands
/// index the column dim innermost, and whose body is arith and math on scalars. The ops without memory effects between the two (views,
/// indices) move above the contraction, so the epilogue's operands are defined where the
/// contraction runs.
std::optional<Epilogue> epilogueOf(linalg::GenericOp op);

/// The linalg.fill that sets a contraction's whole output tile C to +0 just before it (only
/// ops without memory effects, and fills of buffers that cannot be C's memory, between; no
/// input of the contraction that may be C's memory), or null. The contraction writes every
/// element of C, so its accumulators can start at 0 instead (CPU: registers; GPU: each warp
/// tile's fragment) and the fill goes.
linalg::FillOp zeroFillBefore(linalg::GenericOp op);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_EPILOGUE_H
