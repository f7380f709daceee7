//===- MapContractionsToMma.h - tile contractions on tensor cores ---------===//
//
// The tensor-core part of the GPU schedule (MapTilesToGpu.h). A tile
// contraction (C[m, n] += sum_k A B on f32 tiles, as TileBuilder::contraction
// writes it) is mapped to warps instead of threads, in two steps:
//
//  mapped stage (spectra-map-tiles-to-gpu{mma-type=bf16}; runs on the CPU as
//      gpu-emulated): a warp nest (scf.forall mapped to #gpu.warp<x>) whose
//      warps take the contraction's 16 x 8 output tiles in turn. Each tile is
//      the contraction on that tile's windows (edge tiles clipped), marked
//      spectra.mma, its operands rounded to the mma type in its body: bf16
//      products summed in f32, the tensor cores' math, so the emulation
//      computes what the GPU does (in another summation order).
//  launch stage (spectra-launch-mapped-kernels; GPU only): each marked tile
//      becomes per-lane fragments and nvvm.mma.sync m16n8k16 (m16n8k8 when the
//      reduction has at most 8 terms), the accumulator fragment held in
//      registers across the k steps; elements outside the clipped window are
//      read as 0 and not written.
//
//===----------------------------------------------------------------------===//

#ifndef SPECTRA_CODEGEN_MAPCONTRACTIONSTOMMA_H
#define SPECTRA_CODEGEN_MAPCONTRACTIONSTOMMA_H

#include "codegen/Epilogue.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/IR/Builders.h"

#include <optional>

namespace mlir::spectra {

/// The attribute marking a warp tile's contraction (a dictionary: the loop dims taken as
/// the mma's m, n and k, the input read as its A operand, the k step and the operand type).
inline constexpr llvm::StringLiteral kMmaAttr = "spectra.mma";

/// Which loop dims of a contraction play the mma's m (16 rows), n (8 columns) and k, and
/// which input is indexed by m (the A operand).
struct MmaPlan {
  unsigned mDim = 0, nDim = 1, kDim = 2;
  unsigned aInput = 0;
  int64_t kStep = 16;
};

/// The plan for `op` when it is a tile contraction the tensor cores should take: two f32
/// inputs and one f32 output, each indexed by two of the three (static) loop dims, the
/// body out + a * b, and at least a quarter of the padded 16 x 8 x k tiles useful (tiny
/// contractions, such as the causal kernels' 2 x 2 products, stay on the FMA units).
std::optional<MmaPlan> planMma(linalg::GenericOp op);

/// The attribute marking a warp tile's epilogue (Epilogue.h), the generic right after its
/// contraction on the same 16 x 8 window: a dictionary whose `store` says whether the
/// contraction's output must still be stored once the epilogue runs on the fragments.
inline constexpr llvm::StringLiteral kMmaEpilogueAttr = "spectra.mma_epilogue";

/// Replaces `op` by a warp nest (at most `warps` warps, marked with `nestAttr`) over its
/// 16 x 8 output tiles, each tile's contraction marked kMmaAttr with operands rounded to
/// `mmaType`; `split`: each operand x as hi + lo (hi = x rounded, lo = the rest rounded)
/// and the products as lo hi + hi lo + hi hi, three mma per step with nearly f32 products
/// (2^-16 relative instead of bf16's 2^-8). With `epilogue` (Epilogue.h), each tile's
/// contraction is followed by the epilogue on the tile's window, marked kMmaEpilogueAttr,
/// and the epilogue generic goes: at this stage (and so in gpu-emulated's mapped IR before
/// the lanes are emulated) it reads the tile from memory; the lane lowerings below run it
/// on the accumulator fragment. With `zeroInit` (the fill before `op` set its output to
/// 0 and goes: Epilogue.h's zeroFillBefore), each tile is preceded by a fill of its window
/// with 0, which the lane lowerings take as accumulators starting at 0 (the tile not read).
void mapContractionToWarps(linalg::GenericOp op, const MmaPlan &plan, int64_t warps,
                           Type mmaType, bool split, StringRef nestAttr,
                           const Epilogue *epilogue = nullptr, bool zeroInit = false);

/// memref.load of `mem` at `at` where `ok` holds, else f32 0; a plain load where `ok` is
/// null. The fragments' loads of clipped tiles (padding reads as 0).
Value loadIf(OpBuilder &b, Location loc, Value mem, ValueRange at, Value ok);

/// Part `part` of the f32 `x` in the mma operand type: 0, x rounded (RN) to `mmaType`; 1
/// (bf16x3), what that rounding left, rounded.
Value mmaOperandPart(OpBuilder &b, Location loc, Type mmaType, Value x, int part);

/// The order of a step's mma on operand parts (A part, B part): one, or bf16x3's three
/// (lo hi, hi lo, then hi hi: small terms first).
SmallVector<std::pair<int, int>> mmaPartOrder(bool split);

/// nvvm.mma.sync m16n8k`ks` (row.col, `mmaType` operands, f32 accumulators) on the packed
/// registers `aRegs` and `bRegs`, adding to the four accumulators `acc` (updated).
void emitMmaSync(OpBuilder &b, Location loc, Type mmaType, int64_t ks, ValueRange aRegs,
                 ValueRange bRegs, MutableArrayRef<Value> acc);

/// How the CPU model of mma.sync reaches a warp's fragments in memory: an operand element
/// of A or B at (lane, register, half), the accumulator element at (lane, element).
struct MmaModelAccess {
  function_ref<Value(Value lane, Value reg, Value half)> a, b;
  function_ref<Value(Value lane, Value element)> loadC;
  function_ref<void(Value value, Value lane, Value element)> storeD;
};

/// One warp's m16n8k`ks` as the PTX ISA defines it, element by element (D = C + A B with
/// the products summed in k order), each operand element read from the lane and register
/// the ISA's fragment tables put it, written here from row and column, independently of
/// the lane maps that filled them: a wrong lane map gives wrong numbers.
void emitMmaModel(OpBuilder &b, Location loc, int64_t ks, const MmaModelAccess &access);

/// Part `part` of two f32 values as one mma operand register, `first` in the low half:
/// part 0 is each rounded (RN) to `mmaType` (bf16 or f16); part 1 (bf16x3, bf16 only) what
/// that rounding left, rounded. An i32 for bf16, a vector<2xf16> for f16 (what
/// nvvm.mma.sync takes).
Value packMmaPair(OpBuilder &b, Location loc, Type mmaType, Value first, Value second, int part);

/// Lowers a tile contraction marked kMmaAttr (inside a warp, `lane` = thread id mod 32)
/// to fragments and nvvm.mma.sync; fails on an op that is not one. A fill of the tile
/// with 0 just before it starts the accumulators at 0 and goes. Its epilogue (the next
/// op, marked kMmaEpilogueAttr) runs on each lane's four accumulator elements, and the
/// tile is stored only where the epilogue's `store` asks.
LogicalResult lowerWarpMma(linalg::GenericOp op, Value lane);

/// The same on the CPU (gpu-emulated, spectra-emulate-warp-mma): the 32 lanes' fragments,
/// built by the lane maps lowerWarpMma uses, go to a per-warp register file in memory, and
/// a model of mma.sync that reads each operand element where the PTX ISA's fragment tables
/// put it (written independently, from row and column) multiplies them. A wrong lane map
/// gives wrong numbers here, in every emulated test. An epilogue runs on the emulated
/// lanes' accumulators as lowerWarpMma runs it on the GPU's.
LogicalResult emulateWarpMma(linalg::GenericOp op);

} // namespace mlir::spectra

#endif // SPECTRA_CODEGEN_MAPCONTRACTIONSTOMMA_H
