// RUN: spectra-opt %s -spectra-form-fma | FileCheck %s

// a * b + c, either side, becomes one fma; the product goes.
// CHECK-LABEL: func.func @add
// CHECK-SAME:    (%[[A:.*]]: vector<16xf32>, %[[B:.*]]: vector<16xf32>, %[[C:.*]]: vector<16xf32>)
// CHECK-NEXT:    %[[X:.*]] = math.fma %[[A]], %[[B]], %[[C]] : vector<16xf32>
// CHECK-NEXT:    %[[Y:.*]] = math.fma %[[A]], %[[C]], %[[B]] : vector<16xf32>
// CHECK-NEXT:    return %[[X]], %[[Y]]
func.func @add(%a: vector<16xf32>, %b: vector<16xf32>, %c: vector<16xf32>) -> (vector<16xf32>, vector<16xf32>) {
  %p = arith.mulf %a, %b : vector<16xf32>
  %x = arith.addf %p, %c : vector<16xf32>
  %q = arith.mulf %a, %c : vector<16xf32>
  %y = arith.addf %b, %q : vector<16xf32>
  return %x, %y : vector<16xf32>, vector<16xf32>
}

// A subtraction fuses where the negated operand is a constant: x - 0.5 * n (the PosRF
// logits' norm term) and a * b - 1.
// CHECK-LABEL: func.func @sub
// CHECK-DAG:     %[[MHALF:.*]] = arith.constant dense<-5.000000e-01> : vector<8xf32>
// CHECK-DAG:     %[[MONE:.*]] = arith.constant dense<-1.000000e+00> : vector<8xf32>
// CHECK-DAG:     %[[X:.*]] = math.fma %[[MHALF]], %{{.*}}, %{{.*}} : vector<8xf32>
// CHECK-DAG:     %[[Y:.*]] = math.fma %{{.*}}, %{{.*}}, %[[MONE]] : vector<8xf32>
// CHECK-NOT:     arith.mulf
// CHECK-NOT:     arith.subf
func.func @sub(%x: vector<8xf32>, %n: vector<8xf32>, %a: vector<8xf32>) -> (vector<8xf32>, vector<8xf32>) {
  %half = arith.constant dense<0.5> : vector<8xf32>
  %one = arith.constant dense<1.0> : vector<8xf32>
  %p = arith.mulf %n, %half : vector<8xf32>
  %r = arith.subf %x, %p : vector<8xf32>
  %q = arith.mulf %a, %a : vector<8xf32>
  %s = arith.subf %q, %one : vector<8xf32>
  return %r, %s : vector<8xf32>, vector<8xf32>
}

// Without a constant, the negated operand is an arith.negf, which the fma absorbs (vfnmadd,
// vfmsub): c - a * b (the readout gradient's g - r * z) and a * b - c.
// CHECK-LABEL: func.func @sub_negated
// CHECK-SAME:    (%[[A:.*]]: vector<8xf32>, %[[B:.*]]: vector<8xf32>, %[[C:.*]]: vector<8xf32>)
// CHECK-DAG:     %[[NA:.*]] = arith.negf %[[A]] : vector<8xf32>
// CHECK-DAG:     %[[X:.*]] = math.fma %[[NA]], %[[B]], %[[C]] : vector<8xf32>
// CHECK-DAG:     %[[NC:.*]] = arith.negf %[[C]] : vector<8xf32>
// CHECK-DAG:     %[[Y:.*]] = math.fma %[[A]], %[[B]], %[[NC]] : vector<8xf32>
// CHECK-NOT:     arith.mulf
// CHECK-NOT:     arith.subf
// CHECK:         return %[[X]], %[[Y]]
func.func @sub_negated(%a: vector<8xf32>, %b: vector<8xf32>, %c: vector<8xf32>) -> (vector<8xf32>, vector<8xf32>) {
  %p = arith.mulf %a, %b : vector<8xf32>
  %x = arith.subf %c, %p : vector<8xf32>
  %q = arith.mulf %a, %b : vector<8xf32>
  %y = arith.subf %q, %c : vector<8xf32>
  return %x, %y : vector<8xf32>, vector<8xf32>
}

// Left as written: a product with a second use (it is needed anyway), one shared by two
// subtractions (a row's term, kept off the exps' chains), and scalars.
// CHECK-LABEL: func.func @kept
// CHECK:         arith.mulf
// CHECK:         arith.addf
// CHECK:         arith.mulf
// CHECK:         arith.subf
// CHECK:         arith.subf
// CHECK:         arith.mulf {{.*}} : f32
// CHECK:         arith.addf {{.*}} : f32
// CHECK-NOT:     math.fma
func.func @kept(%a: vector<16xf32>, %b: vector<16xf32>, %c: vector<16xf32>, %s: f32) -> (vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, f32) {
  %p = arith.mulf %a, %b : vector<16xf32>
  %x = arith.addf %p, %c : vector<16xf32>
  %q = arith.mulf %a, %c : vector<16xf32>
  %y = arith.subf %b, %q : vector<16xf32>
  %z = arith.subf %c, %q : vector<16xf32>
  %t = arith.mulf %s, %s : f32
  %u = arith.addf %t, %s : f32
  return %x, %p, %y, %z, %u : vector<16xf32>, vector<16xf32>, vector<16xf32>, vector<16xf32>, f32
}
