// RUN: spectra-opt %s -spectra-polynomial-exp=scalef=1 | FileCheck %s --check-prefix=SCALEF
// RUN: spectra-opt %s -spectra-polynomial-exp | FileCheck %s --check-prefix=GENERIC

// With scalef (AVX-512 hosts), a 16-lane exp forms z 2^n with vscalefps; results below 2^-126
// are flushed by its zero mask (x >= -87.336 keeps a lane), and the clamp lets NaN through.
// No lower clamp: the mask zeroes every lane below -87.336, -inf included.
// SCALEF-LABEL: func.func @exp16
// SCALEF-NOT:     -8.800000e+01
// SCALEF-DAG:     %[[FLUSH:.*]] = arith.constant dense<-8.733600e+01> : vector<16xf32>
// SCALEF-DAG:     %[[HIGH:.*]] = arith.constant dense<1.638400e+04> : vector<16xf32>
// SCALEF:         %[[BELOW:.*]] = arith.cmpf ule, %{{.*}}, %[[HIGH]] : vector<16xf32>
// SCALEF:         %[[X:.*]] = arith.select %[[BELOW]], %{{.*}}, %[[HIGH]]
// SCALEF:         %[[LIVE:.*]] = arith.cmpf uge, %[[X]], %[[FLUSH]] : vector<16xf32>
// SCALEF:         math.floor
// SCALEF:         arith.addf
// SCALEF:         %[[MASK:.*]] = llvm.bitcast %[[LIVE]] : vector<16xi1> to i16
// SCALEF:         llvm.call_intrinsic "llvm.x86.avx512.mask.scalef.ps.512"(%{{.*}}, %{{.*}}, %{{.*}}, %[[MASK]], %{{.*}}) : (vector<16xf32>, vector<16xf32>, vector<16xf32>, i16, i32) -> vector<16xf32>
// SCALEF-NOT:     arith.fptosi
// SCALEF-NOT:     math.exp
// GENERIC-LABEL: func.func @exp16
// GENERIC-NOT:    llvm.call_intrinsic
// GENERIC:        arith.fptosi
// GENERIC-NOT:    math.exp
func.func @exp16(%x: vector<16xf32>) -> vector<16xf32> {
  %e = math.exp %x : vector<16xf32>
  return %e : vector<16xf32>
}

// exp(x) * s, the exp's only use: (p + 1) s = fma(p, s, s) before vscalefps, in place of the
// add of 1 and the multiply after it; the coefficient's broadcast moves above the expansion.
// SCALEF-LABEL: func.func @exp16_scaled
// SCALEF:         math.floor
// SCALEF:         %[[S:.*]] = vector.broadcast %{{.*}} : f32 to vector<16xf32>
// SCALEF-NEXT:    %[[Z:.*]] = math.fma %{{.*}}, %[[S]], %[[S]] : vector<16xf32>
// SCALEF:         %[[R:.*]] = llvm.call_intrinsic "llvm.x86.avx512.mask.scalef.ps.512"(%[[Z]],
// SCALEF-NOT:     arith.mulf
// SCALEF:         return %[[R]]
func.func @exp16_scaled(%x: vector<16xf32>, %s: f32) -> vector<16xf32> {
  %e = math.exp %x : vector<16xf32>
  %b = vector.broadcast %s : f32 to vector<16xf32>
  %y = arith.mulf %b, %e : vector<16xf32>
  return %y : vector<16xf32>
}

// A stabilised exp (its argument at most 0 or NaN, marked by the tile kernels) has no
// overflow clamp: the flush mask's compare reads the argument itself.
// SCALEF-LABEL: func.func @exp16_at_most_zero
// SCALEF-NOT:     1.638400e+04
// SCALEF:         %[[LIVE:.*]] = arith.cmpf uge, %arg0, %{{.*}} : vector<16xf32>
// SCALEF:         llvm.call_intrinsic "llvm.x86.avx512.mask.scalef.ps.512"
// SCALEF-NOT:     arith.select
// SCALEF:         return
// Without vscalefps it takes the magic-constant form: t = x log2e + 1.5 2^23 + 127 rounds n
// into t's low bits, 2^n is bits(t) << 23, and lanes below -87.336 are selected to 0; no
// conversion to integers and no clamp.
// GENERIC-LABEL: func.func @exp16_at_most_zero
// GENERIC-NOT:     arith.fptosi
// GENERIC-NOT:     1.638400e+04
// GENERIC:         %[[LIVE:.*]] = arith.cmpf uge, %arg0, %{{.*}} : vector<16xf32>
// GENERIC:         %[[T:.*]] = math.fma %arg0, %{{.*}}, %{{.*}} : vector<16xf32>
// GENERIC:         %[[BITS:.*]] = arith.bitcast %[[T]] : vector<16xf32> to vector<16xi32>
// GENERIC:         %[[POW:.*]] = arith.shli %[[BITS]], %{{.*}} : vector<16xi32>
// GENERIC:         arith.select %[[LIVE]]
// GENERIC-NOT:     arith.fptosi
// GENERIC:         return
func.func @exp16_at_most_zero(%x: vector<16xf32>) -> vector<16xf32> {
  %e = math.exp %x {spectra.exp_at_most_zero} : vector<16xf32>
  return %e : vector<16xf32>
}

// An exp with a second use keeps its own add of 1 and the multiply.
// SCALEF-LABEL: func.func @exp16_two_uses
// SCALEF:         arith.addf
// SCALEF:         llvm.call_intrinsic "llvm.x86.avx512.mask.scalef.ps.512"
// SCALEF:         arith.mulf
func.func @exp16_two_uses(%x: vector<16xf32>, %s: vector<16xf32>) -> (vector<16xf32>, vector<16xf32>) {
  %e = math.exp %x : vector<16xf32>
  %y = arith.mulf %e, %s : vector<16xf32>
  return %y, %e : vector<16xf32>, vector<16xf32>
}

// Other widths and scalars keep MLIR's generic approximation.
// SCALEF-LABEL: func.func @exp8
// SCALEF-NOT:     llvm.call_intrinsic
// SCALEF:         arith.fptosi
// SCALEF-LABEL: func.func @exp_scalar
// SCALEF-NOT:     llvm.call_intrinsic
// SCALEF:         arith.fptosi
func.func @exp8(%x: vector<8xf32>) -> vector<8xf32> {
  %e = math.exp %x : vector<8xf32>
  return %e : vector<8xf32>
}
func.func @exp_scalar(%x: f32) -> f32 {
  %e = math.exp %x : f32
  return %e : f32
}
