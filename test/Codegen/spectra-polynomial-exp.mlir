// RUN: spectra-opt %s -spectra-polynomial-exp=scalef=1 | FileCheck %s --check-prefix=SCALEF
// RUN: spectra-opt %s -spectra-polynomial-exp | FileCheck %s --check-prefix=GENERIC
// RUN: spectra-opt %s -spectra-polynomial-exp=table=1 | FileCheck %s --check-prefix=TABLE
// RUN: spectra-opt %s -spectra-polynomial-exp="scalef=1 table=1" | FileCheck %s --check-prefix=WIDE

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
// With the table form as well (AVX-512 hosts), an unmarked 16-lane exp keeps vscalefps: it
// may overflow, and the table form has no clamp.
// WIDE-LABEL: func.func @exp16(
// WIDE-NOT:     llvm.x86.avx512.permvar
// WIDE:         llvm.x86.avx512.mask.scalef.ps.512
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
// With both (AVX-512 hosts), a stabilised 16-lane exp takes the table form too: k = 16 x log2e
// rounded by the magic constant, 2^(k/16) = 2^n 2^(j/16) from bits(t) << 19 plus a 16-entry
// table read by the zmm vpermd at bits(t)'s low 4 bits; the remainder, |a| <= ln2/32, takes
// the degree-3 polynomial. No vscalefps.
// WIDE-LABEL: func.func @exp16_at_most_zero
// WIDE-DAG:     %[[NINETEEN:.*]] = arith.constant dense<19> : vector<16xi32>
// WIDE-DAG:     %[[TAB:.*]] = arith.constant dense<[1065353216, 1065200323, 1065063874, 1064944595, 1064843248, 1064760626, 1064697559, 1064654911, 1064633587, 1064634532, 1064658730, 1064707212, 1064781053, 1064881375, 1065009351, 1065166205]> : vector<16xi32>
// WIDE-DAG:     %[[MAGIC:.*]] = arith.constant dense<0x4B400000> : vector<16xf32>
// WIDE-DAG:     %[[LOG2E16:.*]] = arith.constant dense<23.0831203> : vector<16xf32>
// WIDE-DAG:     %[[C1:.*]] = arith.constant dense<-0.0433349609> : vector<16xf32>
// WIDE-DAG:     %[[C2:.*]] = arith.constant dense<0.500016153> : vector<16xf32>
// WIDE-DAG:     %[[C3:.*]] = arith.constant dense<0.166667715> : vector<16xf32>
// WIDE:         %[[LIVE:.*]] = arith.cmpf uge, %arg0, %{{.*}} : vector<16xf32>
// WIDE:         %[[T:.*]] = math.fma %arg0, %[[LOG2E16]], %[[MAGIC]] : vector<16xf32>
// WIDE:         %[[K:.*]] = arith.subf %[[T]], %[[MAGIC]] : vector<16xf32>
// WIDE:         %[[A1:.*]] = math.fma %[[C1]], %[[K]], %arg0
// WIDE:         %[[A:.*]] = math.fma %{{.*}}, %[[K]], %[[A1]]
// WIDE:         math.fma %[[A]], %[[C3]], %[[C2]]
// WIDE:         arith.mulf %[[A]], %[[A]]
// WIDE:         %[[P:.*]] = math.fma
// WIDE:         %[[BITS:.*]] = arith.bitcast %[[T]] : vector<16xf32> to vector<16xi32>
// WIDE:         %[[TJ:.*]] = llvm.call_intrinsic "llvm.x86.avx512.permvar.si.512"(%[[TAB]], %[[BITS]]) : (vector<16xi32>, vector<16xi32>) -> vector<16xi32>
// WIDE:         %[[SH:.*]] = arith.shli %[[BITS]], %[[NINETEEN]] : vector<16xi32>
// WIDE:         %[[SUM:.*]] = arith.addi %[[SH]], %[[TJ]] : vector<16xi32>
// WIDE:         %[[POW:.*]] = arith.bitcast %[[SUM]] : vector<16xi32> to vector<16xf32>
// WIDE:         %[[E:.*]] = math.fma %[[P]], %[[POW]], %[[POW]] : vector<16xf32>
// WIDE:         %[[R:.*]] = arith.select %[[LIVE]], %[[E]], %{{.*}} : vector<16xi1>, vector<16xf32>
// WIDE-NOT:     llvm.x86.avx512.mask.scalef
// WIDE:         return %[[R]]
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

// A marked 16-lane exp times a coefficient (the kernels' features): with the table form the
// coefficient multiplies 2^n T_j beside the polynomial and the last step is fma(p, s 2^n T_j,
// s 2^n T_j), as at 8 lanes.
// WIDE-LABEL: func.func @exp16_at_most_zero_scaled
// WIDE:         llvm.call_intrinsic "llvm.x86.avx512.permvar.si.512"
// WIDE:         %[[POW:.*]] = arith.bitcast %{{.*}} : vector<16xi32> to vector<16xf32>
// WIDE-NEXT:    %[[S:.*]] = vector.broadcast %arg1 : f32 to vector<16xf32>
// WIDE-NEXT:    %[[SP:.*]] = arith.mulf %[[POW]], %[[S]] : vector<16xf32>
// WIDE-NEXT:    %[[E:.*]] = math.fma %{{.*}}, %[[SP]], %[[SP]] : vector<16xf32>
// WIDE-NEXT:    %[[R:.*]] = arith.select %{{.*}}, %[[E]], %{{.*}}
// WIDE-NEXT:    return %[[R]]
func.func @exp16_at_most_zero_scaled(%x: vector<16xf32>, %s: f32) -> vector<16xf32> {
  %e = math.exp %x {spectra.exp_at_most_zero} : vector<16xf32>
  %b = vector.broadcast %s : f32 to vector<16xf32>
  %y = arith.mulf %b, %e : vector<16xf32>
  return %y : vector<16xf32>
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

// With table (AVX2 hosts), a stabilised 8-lane exp rounds k = 8 x log2e by the magic constant
// 1.5 2^23 and takes 2^(k/8) = 2^n 2^(j/8) from bits(t) << 20 plus an 8-entry table read by
// vpermd at bits(t)'s low 3 bits; the remainder, a quarter as wide, takes a degree-3
// polynomial (two FMAs and a square); lanes below -87.336 are selected to 0.
// TABLE-LABEL: func.func @exp8_at_most_zero
// TABLE-DAG:     %[[TWENTY:.*]] = arith.constant dense<20> : vector<8xi32>
// TABLE-DAG:     %[[TAB:.*]] = arith.constant dense<[1065353216, 1065063874, 1064843248, 1064697559, 1064633587, 1064658730, 1064781053, 1065009351]> : vector<8xi32>
// TABLE-DAG:     %[[MAGIC:.*]] = arith.constant dense<0x4B400000> : vector<8xf32>
// TABLE-DAG:     %[[LOG2E8:.*]] = arith.constant dense<11.5415602> : vector<8xf32>
// TABLE:         %[[LIVE:.*]] = arith.cmpf uge, %arg0, %{{.*}} : vector<8xf32>
// TABLE:         %[[T:.*]] = math.fma %arg0, %[[LOG2E8]], %[[MAGIC]] : vector<8xf32>
// TABLE:         %[[K:.*]] = arith.subf %[[T]], %[[MAGIC]] : vector<8xf32>
// TABLE-COUNT-3: math.fma
// TABLE:         arith.mulf
// TABLE:         %[[P:.*]] = math.fma
// TABLE:         %[[BITS:.*]] = arith.bitcast %[[T]] : vector<8xf32> to vector<8xi32>
// TABLE:         %[[TJ:.*]] = llvm.call_intrinsic "llvm.x86.avx2.permd"(%[[TAB]], %[[BITS]]) : (vector<8xi32>, vector<8xi32>) -> vector<8xi32>
// TABLE:         %[[SH:.*]] = arith.shli %[[BITS]], %[[TWENTY]] : vector<8xi32>
// TABLE:         %[[SUM:.*]] = arith.addi %[[SH]], %[[TJ]] : vector<8xi32>
// TABLE:         %[[POW:.*]] = arith.bitcast %[[SUM]] : vector<8xi32> to vector<8xf32>
// TABLE:         %[[E:.*]] = math.fma %[[P]], %[[POW]], %[[POW]] : vector<8xf32>
// TABLE:         %[[R:.*]] = arith.select %[[LIVE]], %[[E]], %{{.*}} : vector<8xi1>, vector<8xf32>
// TABLE-NOT:     math.exp
// TABLE:         return %[[R]]
// Without it, the magic-constant form of BitsExp (2^n = bits << 23, degree 6).
// GENERIC-LABEL: func.func @exp8_at_most_zero
// GENERIC-NOT:     llvm.call_intrinsic
// GENERIC:         arith.constant dense<23> : vector<8xi32>
// GENERIC:         return
// A marked 8-lane exp keeps the 8-entry table where 16-lane ones take the wide one.
// WIDE-LABEL: func.func @exp8_at_most_zero
// WIDE:         llvm.x86.avx2.permd
// WIDE-NOT:     llvm.x86.avx512.permvar
// WIDE:         return
func.func @exp8_at_most_zero(%x: vector<8xf32>) -> vector<8xf32> {
  %e = math.exp %x {spectra.exp_at_most_zero} : vector<8xf32>
  return %e : vector<8xf32>
}

// exp(x) s, the exp's only use: s 2^n T_j is formed beside the polynomial and the last step is
// fma(p, s 2^n T_j, s 2^n T_j), the exp's multiply gone; the coefficient's broadcast moves
// up to where the exp stood.
// TABLE-LABEL: func.func @exp8_scaled
// TABLE:         arith.mulf
// TABLE-NEXT:    %[[P:.*]] = math.fma %{{.*}}, %{{.*}}, %{{.*}} : vector<8xf32>
// TABLE:         llvm.call_intrinsic "llvm.x86.avx2.permd"
// TABLE:         %[[POW:.*]] = arith.bitcast %{{.*}} : vector<8xi32> to vector<8xf32>
// TABLE-NEXT:    %[[S:.*]] = vector.broadcast %arg1 : f32 to vector<8xf32>
// TABLE-NEXT:    %[[SP:.*]] = arith.mulf %[[POW]], %[[S]] : vector<8xf32>
// TABLE-NEXT:    %[[E:.*]] = math.fma %[[P]], %[[SP]], %[[SP]] : vector<8xf32>
// TABLE-NEXT:    %[[R:.*]] = arith.select %{{.*}}, %[[E]], %{{.*}}
// TABLE-NEXT:    return %[[R]]
func.func @exp8_scaled(%x: vector<8xf32>, %s: f32) -> vector<8xf32> {
  %e = math.exp %x {spectra.exp_at_most_zero} : vector<8xf32>
  %b = vector.broadcast %s : f32 to vector<8xf32>
  %y = arith.mulf %b, %e : vector<8xf32>
  return %y : vector<8xf32>
}

// Unmarked 8-lane exps and 16-lane ones do not take the table form.
// TABLE-LABEL: func.func @exp8_unmarked
// TABLE-NOT:     llvm.x86.avx2.permd
// TABLE:         arith.fptosi
// TABLE-LABEL: func.func @exp16_marked_table
// TABLE-NOT:     llvm.x86.avx2.permd
// TABLE:         arith.constant dense<23> : vector<16xi32>
func.func @exp8_unmarked(%x: vector<8xf32>) -> vector<8xf32> {
  %e = math.exp %x : vector<8xf32>
  return %e : vector<8xf32>
}
func.func @exp16_marked_table(%x: vector<16xf32>) -> vector<16xf32> {
  %e = math.exp %x {spectra.exp_at_most_zero} : vector<16xf32>
  return %e : vector<16xf32>
}
