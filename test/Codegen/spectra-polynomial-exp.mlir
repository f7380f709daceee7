// RUN: spectra-opt %s -spectra-polynomial-exp=scalef=1 | FileCheck %s --check-prefix=SCALEF
// RUN: spectra-opt %s -spectra-polynomial-exp | FileCheck %s --check-prefix=GENERIC

// With scalef (AVX-512 hosts), a 16-lane exp forms z 2^n with vscalefps; results below 2^-126
// are flushed by its zero mask (x >= -87.336 keeps a lane), and the clamps let NaN through.
// SCALEF-LABEL: func.func @exp16
// SCALEF-DAG:     %[[FLUSH:.*]] = arith.constant dense<-8.733600e+01> : vector<16xf32>
// SCALEF-DAG:     %[[LOW:.*]] = arith.constant dense<-8.800000e+01> : vector<16xf32>
// SCALEF:         %[[ABOVE:.*]] = arith.cmpf uge, %{{.*}}, %[[LOW]] : vector<16xf32>
// SCALEF:         %[[LIVE:.*]] = arith.cmpf uge, %{{.*}}, %[[FLUSH]] : vector<16xf32>
// SCALEF:         math.floor
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
