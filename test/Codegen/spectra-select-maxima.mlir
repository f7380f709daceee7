// RUN: spectra-opt %s -spectra-select-maxima | FileCheck %s

// Tests that IEEE maximum and minimum (six instructions each on x86 before AVX10.2)
// become the compare-and-select form of maxps/minps, on vectors and scalars alike.
// CHECK-LABEL: func.func @extrema(
// CHECK-SAME: %[[A:.*]]: vector<16xf32>, %[[B:.*]]: vector<16xf32>, %[[X:.*]]: f32, %[[Y:.*]]: f32
// CHECK: %[[GT:.*]] = arith.cmpf ogt, %[[A]], %[[B]] : vector<16xf32>
// CHECK: %[[MAX:.*]] = arith.select %[[GT]], %[[A]], %[[B]] : vector<16xi1>, vector<16xf32>
// CHECK: %[[LT:.*]] = arith.cmpf olt, %[[X]], %[[Y]] : f32
// CHECK: %[[MIN:.*]] = arith.select %[[LT]], %[[X]], %[[Y]] : f32
// CHECK: return %[[MAX]], %[[MIN]]
// CHECK-NOT: arith.maximumf
// CHECK-NOT: arith.minimumf
func.func @extrema(%a: vector<16xf32>, %b: vector<16xf32>, %x: f32, %y: f32) -> (vector<16xf32>, f32) {
  %m = arith.maximumf %a, %b : vector<16xf32>
  %n = arith.minimumf %x, %y : f32
  return %m, %n : vector<16xf32>, f32
}
