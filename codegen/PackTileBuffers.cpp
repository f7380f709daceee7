//===- PackTileBuffers.cpp - tile buffers at distinct offsets modulo 4 KiB -===//
//
// spectra-pack-tile-buffers: a CPU kernel's constant-size stack buffers become slices of
// one arena, each starting at its own offset modulo 4096, so that loops reading one tile
// while writing another at the same index do not stall on 4K aliasing (Passes.td).
//
//===----------------------------------------------------------------------===//

#include "codegen/Passes.h"
#include "mlir/Interfaces/DataLayoutInterfaces.h"
#include "llvm/Support/MathExtras.h"
#include <limits>

namespace mlir::spectra {
#define GEN_PASS_DEF_SPECTRAPACKTILEBUFFERS
#include "codegen/Passes.h.inc"
} // namespace mlir::spectra

using namespace mlir;

namespace {
constexpr uint64_t kPage = 4096;      // the address bits a store-to-load check compares
constexpr uint64_t kLine = 64;        // a cache line, and the arena's alignment
constexpr uint64_t kSmallest = 256;   // smaller buffers stay allocas (SROA may promote them)

struct PackTileBuffersPass
    : spectra::impl::SpectraPackTileBuffersBase<PackTileBuffersPass> {
  void runOnOperation() override {
    LLVM::LLVMFuncOp fn = getOperation();
    if (fn.isExternal())
      return;
    Block &entry = fn.getBody().front();
    const DataLayout &layout = DataLayout::closest(fn);
    auto ptrType = LLVM::LLVMPointerType::get(&getContext());
    struct Buffer {
      LLVM::AllocaOp alloca;
      uint64_t bytes;
    };
    SmallVector<Buffer> buffers;
    for (auto alloca : entry.getOps<LLVM::AllocaOp>()) {
      auto size = alloca.getArraySize().getDefiningOp<LLVM::ConstantOp>();
      auto count = size ? dyn_cast<IntegerAttr>(size.getValue()) : IntegerAttr();
      Type element = alloca.getElemType();
      uint64_t align = layout.getTypeABIAlignment(element);
      if (!count || count.getInt() <= 0 || alloca.getType() != ptrType ||
          std::max<uint64_t>(alloca.getAlignment().value_or(0), align) > kLine)
        continue;
      // An array's stride: the element's size rounded up to its alignment (LLVM's alloc size).
      uint64_t bytes = llvm::alignTo(layout.getTypeSize(element), align) * count.getInt();
      if (bytes >= kSmallest)
        buffers.push_back({alloca, bytes});
    }
    if (buffers.size() < 2)
      return;
    // Buffer i starts at (i * spacing) mod 4096, the slots spread evenly over a page.
    uint64_t spacing = std::max(kLine, kPage / buffers.size() / kLine * kLine);
    SmallVector<uint64_t> offsets;
    uint64_t end = 0;
    for (auto [i, buffer] : llvm::enumerate(buffers)) {
      uint64_t slot = (i * spacing) % kPage;
      uint64_t start = llvm::alignTo(end, kLine);
      start += (slot + kPage - start % kPage) % kPage;
      offsets.push_back(start);
      end = start + buffer.bytes;
    }
    if (end > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
      return;  // a GEP's constant index is 32 bits; such a frame would not fit a stack anyway
    OpBuilder b(&entry, entry.begin());
    Location loc = fn.getLoc();
    auto i64 = b.getI64Type();
    Value total = LLVM::ConstantOp::create(b, loc, i64, b.getI64IntegerAttr(end));
    Value arena = LLVM::AllocaOp::create(b, loc, ptrType, b.getI8Type(), total, kLine);
    for (auto [buffer, offset] : llvm::zip(buffers, offsets)) {
      b.setInsertionPoint(buffer.alloca);
      Value slice = LLVM::GEPOp::create(b, buffer.alloca.getLoc(), ptrType, b.getI8Type(), arena,
                                        ArrayRef<LLVM::GEPArg>{static_cast<int32_t>(offset)});
      buffer.alloca.replaceAllUsesWith(slice);
      buffer.alloca.erase();
    }
  }
};
} // namespace
