// RUN: spectra-opt %s -spectra-shorten-chains | FileCheck %s

// PosRF's exponent in query_backward, ((l - 0.5 n) + c) - m with l a tile's element, n and m
// a row's (broadcast) and c a column's (rank-1 buffer): the row's terms are combined first,
// then the column's, and l is added last, one operation before the exp.
// CHECK-LABEL: func.func @exponent
// CHECK-SAME:    (%[[T:.*]]: memref<4x16xf32>, %[[C:.*]]: memref<16xf32>, %[[N:.*]]: f32, %[[M:.*]]: f32)
// CHECK-DAG:     %[[L:.*]] = vector.load %[[T]]
// CHECK-DAG:     %[[CV:.*]] = vector.load %[[C]]
// CHECK-DAG:     %[[NB:.*]] = vector.broadcast %[[N]]
// CHECK-DAG:     %[[MB:.*]] = vector.broadcast %[[M]]
// CHECK:         %[[H:.*]] = arith.mulf %[[NB]], %{{.*}} : vector<8xf32>
// CHECK:         %[[HM:.*]] = arith.addf %[[MB]], %[[H]] : vector<8xf32>
// CHECK:         %[[CT:.*]] = arith.subf %[[CV]], %[[HM]] : vector<8xf32>
// CHECK:         %[[E:.*]] = arith.addf %[[L]], %[[CT]] : vector<8xf32>
// CHECK-NEXT:    %[[X:.*]] = math.exp %[[E]]
// CHECK-NEXT:    return %[[X]]
func.func @exponent(%t: memref<4x16xf32>, %c: memref<16xf32>, %n: f32, %m: f32) -> vector<8xf32> {
  %i0 = arith.constant 0 : index
  %half = arith.constant dense<0.5> : vector<8xf32>
  %l = vector.load %t[%i0, %i0] : memref<4x16xf32>, vector<8xf32>
  %cv = vector.load %c[%i0] : memref<16xf32>, vector<8xf32>
  %nb = vector.broadcast %n : f32 to vector<8xf32>
  %mb = vector.broadcast %m : f32 to vector<8xf32>
  %h = arith.mulf %nb, %half : vector<8xf32>
  %0 = arith.subf %l, %h : vector<8xf32>
  %1 = arith.addf %0, %cv : vector<8xf32>
  %2 = arith.subf %1, %mb : vector<8xf32>
  %x = math.exp %2 : vector<8xf32>
  return %x : vector<8xf32>
}

// Each sign: b - (x + a) = (b - a) - x, (a - x) - b = (a - b) - x, (x - a) - b = x - (a + b).
// CHECK-LABEL: func.func @signs
// CHECK-SAME:    (%[[X:.*]]: vector<8xf32>, %[[A:.*]]: f32, %[[B:.*]]: f32)
// CHECK-DAG:     %[[AB:.*]] = vector.broadcast %[[A]]
// CHECK-DAG:     %[[BB:.*]] = vector.broadcast %[[B]]
// CHECK-DAG:     %[[T0:.*]] = arith.subf %[[BB]], %[[AB]] : vector<8xf32>
// CHECK-DAG:     %[[R0:.*]] = arith.subf %[[T0]], %[[X]] : vector<8xf32>
// CHECK-DAG:     %[[T1:.*]] = arith.subf %[[AB]], %[[BB]] : vector<8xf32>
// CHECK-DAG:     %[[R1:.*]] = arith.subf %[[T1]], %[[X]] : vector<8xf32>
// CHECK-DAG:     %[[T2:.*]] = arith.addf %[[AB]], %[[BB]] : vector<8xf32>
// CHECK-DAG:     %[[R2:.*]] = arith.subf %[[X]], %[[T2]] : vector<8xf32>
// CHECK:         return %[[R0]], %[[R1]], %[[R2]]
func.func @signs(%x: vector<8xf32>, %a: f32, %b: f32) -> (vector<8xf32>, vector<8xf32>, vector<8xf32>) {
  %ab = vector.broadcast %a : f32 to vector<8xf32>
  %bb = vector.broadcast %b : f32 to vector<8xf32>
  %0 = arith.addf %x, %ab : vector<8xf32>
  %r0 = arith.subf %bb, %0 : vector<8xf32>
  %1 = arith.subf %ab, %x : vector<8xf32>
  %r1 = arith.subf %1, %bb : vector<8xf32>
  %2 = arith.subf %x, %ab : vector<8xf32>
  %r2 = arith.subf %2, %bb : vector<8xf32>
  return %r0, %r1, %r2 : vector<8xf32>, vector<8xf32>, vector<8xf32>
}

// Left as written: an inner sum with a second use; terms that vary along as many axes as x;
// scalars.
// CHECK-LABEL: func.func @kept
// CHECK-NEXT:    %[[AB:.*]] = vector.broadcast
// CHECK-NEXT:    %[[I1:.*]] = arith.addf %arg0, %[[AB]]
// CHECK-NEXT:    %{{.*}} = arith.addf %[[I1]], %[[AB]]
// CHECK-NEXT:    %[[I2:.*]] = arith.addf %arg0, %arg1
// CHECK-NEXT:    %{{.*}} = arith.addf %[[I2]], %[[AB]]
// CHECK-NEXT:    %[[S:.*]] = arith.addf %arg2, %arg2 : f32
// CHECK-NEXT:    %{{.*}} = arith.addf %[[S]], %arg2 : f32
func.func @kept(%x: vector<8xf32>, %y: vector<8xf32>, %s: f32) -> (vector<8xf32>, vector<8xf32>, vector<8xf32>, f32) {
  %ab = vector.broadcast %s : f32 to vector<8xf32>
  %1 = arith.addf %x, %ab : vector<8xf32>
  %r1 = arith.addf %1, %ab : vector<8xf32>
  %2 = arith.addf %x, %y : vector<8xf32>
  %r2 = arith.addf %2, %ab : vector<8xf32>
  %3 = arith.addf %s, %s : f32
  %r3 = arith.addf %3, %s : f32
  return %r1, %1, %r2, %r3 : vector<8xf32>, vector<8xf32>, vector<8xf32>, f32
}
