// RUN: spectra-opt %s -split-input-file -spectra-vectorize-tiles="vector-width=8 register-rows=4 register-vectors=2" -canonicalize -cse | FileCheck %s

// Columns past the last whole vector (SGQ's 65th feature at 16 lanes) whose body has an exp
// run down the rows, a vector of rows at a time, where each row would take a whole vector's
// exp for one lane. An elementwise generic: its whole vectors row by row, then column 16 for
// rows 0-7 and 8-15: that column of %l gathered from 8 rows, the row operand loaded as a
// vector, the column operand broadcast, one 8-lane exp, the lanes stored down the column.
#full = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
#col = affine_map<(i, j) -> (j)>
// CHECK-LABEL: func.func @tail_down_rows(
// CHECK-SAME: %[[L:.*]]: memref<16x17xf32>, %[[M:.*]]: memref<16xf32>, %[[C:.*]]: memref<17xf32>, %[[OUT:.*]]: memref<16x17xf32>)
// CHECK: scf.for %[[I:.*]] = %c0 to %c16 step %c1 {
// CHECK: scf.for %[[J:.*]] = %c0 to %c16 step %c8 {
// CHECK: math.exp %{{.*}} : vector<8xf32>
// CHECK: vector.store %{{.*}}, %[[OUT]][%[[I]], %[[J]]] : memref<16x17xf32>, vector<8xf32>
// CHECK-NOT: vector<1xf32>
// CHECK: scf.for %[[R0:.*]] = %c0 to %c16 step %c8 {
// CHECK: %[[R1:.*]] = arith.addi %[[R0]], %c1 : index
// CHECK: %[[R2:.*]] = arith.addi %[[R0]], %c2 : index
// CHECK-COUNT-5: arith.addi %[[R0]]
// CHECK: %[[X0:.*]] = memref.load %[[L]][%[[R0]], %c16] : memref<16x17xf32>
// CHECK: %[[X1:.*]] = memref.load %[[L]][%[[R1]], %c16] : memref<16x17xf32>
// CHECK: %[[X2:.*]] = memref.load %[[L]][%[[R2]], %c16] : memref<16x17xf32>
// CHECK-COUNT-5: memref.load %[[L]][%{{.*}}, %c16] : memref<16x17xf32>
// CHECK: %[[G:.*]] = vector.from_elements %[[X0]], %[[X1]], %[[X2]], {{.*}} : vector<8xf32>
// CHECK: %[[ROWS:.*]] = vector.load %[[M]][%[[R0]]] : memref<16xf32>, vector<8xf32>
// CHECK: %[[K:.*]] = memref.load %[[C]][%c16] : memref<17xf32>
// CHECK: %[[KB:.*]] = vector.broadcast %[[K]] : f32 to vector<8xf32>
// CHECK: %[[D:.*]] = arith.subf %[[G]], %[[ROWS]] : vector<8xf32>
// CHECK: %[[S:.*]] = arith.subf %[[D]], %[[KB]] : vector<8xf32>
// CHECK: %[[E:.*]] = math.exp %[[S]] : vector<8xf32>
// CHECK: %[[E0:.*]] = vector.extract %[[E]][0] : f32 from vector<8xf32>
// CHECK: memref.store %[[E0]], %[[OUT]][%[[R0]], %c16] : memref<16x17xf32>
// CHECK: %[[E1:.*]] = vector.extract %[[E]][1] : f32 from vector<8xf32>
// CHECK: memref.store %[[E1]], %[[OUT]][%[[R1]], %c16] : memref<16x17xf32>
// CHECK: %[[E2:.*]] = vector.extract %[[E]][2] : f32 from vector<8xf32>
// CHECK: memref.store %[[E2]], %[[OUT]][%[[R2]], %c16] : memref<16x17xf32>
// CHECK-COUNT-5: memref.store %{{.*}}, %[[OUT]][%{{.*}}, %c16] : memref<16x17xf32>
// CHECK-NOT: vector<1xf32>
// CHECK: return
func.func @tail_down_rows(%l: memref<16x17xf32>, %m: memref<16xf32>, %c: memref<17xf32>, %out: memref<16x17xf32>) {
  linalg.generic {indexing_maps = [#full, #row, #col, #full], iterator_types = ["parallel", "parallel"]}
      ins(%l, %m, %c : memref<16x17xf32>, memref<16xf32>, memref<17xf32>) outs(%out : memref<16x17xf32>) {
  ^bb0(%x: f32, %r: f32, %k: f32, %o: f32):
    %d = arith.subf %x, %r : f32
    %s = arith.subf %d, %k : f32
    %e = math.exp %s : f32
    linalg.yield %e : f32
  }
  return
}

// -----

// Without an exp the tail stays a narrow vector per row (its few operations cost no more
// than gathering them), and so it does where the rows are not a whole number of vectors, or
// where the output is an input's buffer read through another view (here row i reads t[0, i+1],
// whose last, t[0, 16], is the tail column: run after the other columns, the tail would be
// read after row 0 wrote it, where per row it was read first).
#full = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
// CHECK-LABEL: func.func @tails_kept_per_row(
// CHECK-NOT: vector.from_elements
// CHECK: arith.subf %{{.*}} : vector<1xf32>
// CHECK: math.exp %{{.*}} : vector<1xf32>
// CHECK: math.exp %{{.*}} : vector<1xf32>
// CHECK-NOT: vector.from_elements
// CHECK: return
func.func @tails_kept_per_row(%l: memref<16x17xf32>, %m: memref<16xf32>, %out: memref<16x17xf32>,
                              %l12: memref<12x17xf32>, %out12: memref<12x17xf32>,
                              %t: memref<16x17xf32>) {
  linalg.generic {indexing_maps = [#full, #row, #full], iterator_types = ["parallel", "parallel"]}
      ins(%l, %m : memref<16x17xf32>, memref<16xf32>) outs(%out : memref<16x17xf32>) {
  ^bb0(%x: f32, %r: f32, %o: f32):
    %d = arith.subf %x, %r : f32
    linalg.yield %d : f32
  }
  linalg.generic {indexing_maps = [#full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%l12 : memref<12x17xf32>) outs(%out12 : memref<12x17xf32>) {
  ^bb0(%x: f32, %o: f32):
    %e = math.exp %x : f32
    linalg.yield %e : f32
  }
  %view = memref.subview %t[0, 1] [1, 16] [1, 1] : memref<16x17xf32> to memref<16xf32, strided<[1], offset: 1>>
  linalg.generic {indexing_maps = [#full, #row, #full], iterator_types = ["parallel", "parallel"]}
      ins(%t, %view : memref<16x17xf32>, memref<16xf32, strided<[1], offset: 1>>) outs(%t : memref<16x17xf32>) {
  ^bb0(%x: f32, %r: f32, %o: f32):
    %d = arith.subf %x, %r : f32
    %e = math.exp %d : f32
    linalg.yield %e : f32
  }
  return
}

// -----

// A contraction's epilogue on a column formed as dot products (dotTail: 17 columns at 8
// lanes) runs down the register tile's 4 rows: their 4 lane sums in one vector (the folded
// sums hold rows 0-3 in lanes 0, 4, 2, 6), the row operand loaded as a vector, one 4-lane
// exp, its lanes stored down column 16. The first 16 columns keep the register tile and its
// epilogue.
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
#full = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
#col = affine_map<(i, j) -> (j)>
// CHECK-LABEL: func.func @epilogue_down_rows(
// CHECK-SAME: %[[A:.*]]: memref<4x32xf32>, %[[B:.*]]: memref<32x17xf32>, %[[M:.*]]: memref<4xf32>, %[[C:.*]]: memref<17xf32>, %[[OUT:.*]]: memref<4x17xf32>)
// CHECK-NOT: memref.alloca
// CHECK: math.exp %{{.*}} : vector<8xf32>
// CHECK: vector.store %{{.*}}, %[[OUT]][%c0, %c8] : memref<4x17xf32>, vector<8xf32>
// CHECK: vector.shuffle
// CHECK: %[[L0:.*]] = vector.extract %[[F:.*]][0] : f32 from vector<8xf32>
// CHECK: %[[L2:.*]] = vector.extract %[[F]][2] : f32 from vector<8xf32>
// CHECK: %[[L4:.*]] = vector.extract %[[F]][4] : f32 from vector<8xf32>
// CHECK: %[[L6:.*]] = vector.extract %[[F]][6] : f32 from vector<8xf32>
// CHECK: %[[SUMS:.*]] = vector.from_elements %[[L0]], %[[L4]], %[[L2]], %[[L6]] : vector<4xf32>
// CHECK: %[[ROWS:.*]] = vector.load %[[M]][%c0] : memref<4xf32>, vector<4xf32>
// CHECK: %[[K:.*]] = memref.load %[[C]][%c16] : memref<17xf32>
// CHECK: %[[KB:.*]] = vector.broadcast %[[K]] : f32 to vector<4xf32>
// CHECK: %[[D:.*]] = arith.subf %[[SUMS]], %[[ROWS]] : vector<4xf32>
// CHECK: %[[S:.*]] = arith.subf %[[D]], %[[KB]] : vector<4xf32>
// CHECK: %[[E:.*]] = math.exp %[[S]] : vector<4xf32>
// CHECK: %[[E0:.*]] = vector.extract %[[E]][0] : f32 from vector<4xf32>
// CHECK: memref.store %[[E0]], %[[OUT]][%c0, %c16] : memref<4x17xf32>
// CHECK-COUNT-3: memref.store %{{.*}}, %[[OUT]][%{{.*}}, %c16] : memref<4x17xf32>
// CHECK-NOT: vector<1xf32>
// CHECK: return
func.func @epilogue_down_rows(%A: memref<4x32xf32>, %B: memref<32x17xf32>, %m: memref<4xf32>,
                              %cc: memref<17xf32>, %out: memref<4x17xf32>) {
  %C = memref.alloca() : memref<4x17xf32>
  %zero = arith.constant 0.000000e+00 : f32
  linalg.fill ins(%zero : f32) outs(%C : memref<4x17xf32>)
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x32xf32>, memref<32x17xf32>) outs(%C : memref<4x17xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#full, #row, #col, #full], iterator_types = ["parallel", "parallel"]}
      ins(%C, %m, %cc : memref<4x17xf32>, memref<4xf32>, memref<17xf32>) outs(%out : memref<4x17xf32>) {
  ^bb0(%l: f32, %r: f32, %k: f32, %o: f32):
    %d = arith.subf %l, %r : f32
    %s = arith.subf %d, %k : f32
    %e = math.exp %s : f32
    linalg.yield %e : f32
  }
  return
}

// -----

// The same where C is not zero-filled first and is read after the epilogue (an argument):
// each row's sum is added to C's old value and stored back before the epilogue, which reads
// C as its second input.
#a = affine_map<(m, n, k) -> (m, k)>
#b = affine_map<(m, n, k) -> (k, n)>
#c = affine_map<(m, n, k) -> (m, n)>
#full = affine_map<(i, j) -> (i, j)>
#row = affine_map<(i, j) -> (i)>
// CHECK-LABEL: func.func @epilogue_down_rows_into_c(
// CHECK-SAME: %[[A:.*]]: memref<4x32xf32>, %[[B:.*]]: memref<32x17xf32>, %[[M:.*]]: memref<4xf32>, %[[C:.*]]: memref<4x17xf32>, %[[OUT:.*]]: memref<4x17xf32>)
// CHECK: %[[L0:.*]] = vector.extract %[[F:.*]][0] : f32 from vector<8xf32>
// CHECK: %[[L2:.*]] = vector.extract %[[F]][2] : f32 from vector<8xf32>
// CHECK: %[[L4:.*]] = vector.extract %[[F]][4] : f32 from vector<8xf32>
// CHECK: %[[L6:.*]] = vector.extract %[[F]][6] : f32 from vector<8xf32>
// CHECK: %[[O0:.*]] = memref.load %[[C]][%c0, %c16] : memref<4x17xf32>
// CHECK: %[[S0:.*]] = arith.addf %[[O0]], %[[L0]] : f32
// CHECK: memref.store %[[S0]], %[[C]][%c0, %c16] : memref<4x17xf32>
// CHECK: %[[O1:.*]] = memref.load %[[C]][%c1, %c16] : memref<4x17xf32>
// CHECK: %[[S1:.*]] = arith.addf %[[O1]], %[[L4]] : f32
// CHECK: memref.store %[[S1]], %[[C]][%c1, %c16] : memref<4x17xf32>
// CHECK: %[[O2:.*]] = memref.load %[[C]][%c2, %c16] : memref<4x17xf32>
// CHECK: %[[S2:.*]] = arith.addf %[[O2]], %[[L2]] : f32
// CHECK: memref.store %[[S2]], %[[C]][%c2, %c16] : memref<4x17xf32>
// CHECK: %[[O3:.*]] = memref.load %[[C]][%c3, %c16] : memref<4x17xf32>
// CHECK: %[[S3:.*]] = arith.addf %[[O3]], %[[L6]] : f32
// CHECK: memref.store %[[S3]], %[[C]][%c3, %c16] : memref<4x17xf32>
// CHECK: %[[V:.*]] = vector.from_elements %[[S0]], %[[S1]], %[[S2]], %[[S3]] : vector<4xf32>
// CHECK: %[[ROWS:.*]] = vector.load %[[M]][%c0] : memref<4xf32>, vector<4xf32>
// CHECK: %[[D:.*]] = arith.subf %[[V]], %[[ROWS]] : vector<4xf32>
// CHECK: math.exp %[[D]] : vector<4xf32>
// CHECK-COUNT-4: memref.store %{{.*}}, %[[OUT]][%{{.*}}, %c16] : memref<4x17xf32>
// CHECK-NOT: vector<1xf32>
// CHECK: return
func.func @epilogue_down_rows_into_c(%A: memref<4x32xf32>, %B: memref<32x17xf32>, %m: memref<4xf32>,
                                     %C: memref<4x17xf32>, %out: memref<4x17xf32>) {
  linalg.generic {indexing_maps = [#a, #b, #c], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%A, %B : memref<4x32xf32>, memref<32x17xf32>) outs(%C : memref<4x17xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %x, %y : f32
    %s = arith.addf %acc, %p : f32
    linalg.yield %s : f32
  }
  linalg.generic {indexing_maps = [#row, #full, #full], iterator_types = ["parallel", "parallel"]}
      ins(%m, %C : memref<4xf32>, memref<4x17xf32>) outs(%out : memref<4x17xf32>) {
  ^bb0(%r: f32, %l: f32, %o: f32):
    %d = arith.subf %l, %r : f32
    %e = math.exp %d : f32
    linalg.yield %e : f32
  }
  return
}
