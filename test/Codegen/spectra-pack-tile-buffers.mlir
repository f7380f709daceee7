// RUN: spectra-opt %s -split-input-file -pass-pipeline='builtin.module(llvm.func(spectra-pack-tile-buffers))' | FileCheck %s

// Tests that a kernel's 16 KiB tile buffers, which laid out one after another would all
// start at the same address modulo 4096 (4K aliasing between a loop's loads and stores),
// become slices of one 64-byte-aligned arena at offsets 0 and 16384 + 2048: with two
// buffers the slots are 2048 bytes apart modulo 4 KiB. A 128-byte buffer (below the
// 256-byte threshold) and one that asks for 128-byte alignment stay allocas.
// CHECK-LABEL: llvm.func @two_tiles(
// CHECK: %[[TOTAL:.*]] = llvm.mlir.constant(34816 : i64) : i64
// CHECK: %[[ARENA:.*]] = llvm.alloca %[[TOTAL]] x i8 {alignment = 64 : i64} : (i64) -> !llvm.ptr
// CHECK: %[[A:.*]] = llvm.getelementptr %[[ARENA]][0] : (!llvm.ptr) -> !llvm.ptr, i8
// CHECK: %[[B:.*]] = llvm.getelementptr %[[ARENA]][18432] : (!llvm.ptr) -> !llvm.ptr, i8
// CHECK: llvm.alloca %{{.*}} x f32 : (i64) -> !llvm.ptr
// CHECK: llvm.alloca %{{.*}} x f32 {alignment = 128 : i64} : (i64) -> !llvm.ptr
// CHECK: llvm.store %{{.*}}, %[[A]] : f32, !llvm.ptr
// CHECK: llvm.store %{{.*}}, %[[B]] : f32, !llvm.ptr
// CHECK-NOT: llvm.alloca
llvm.func @two_tiles(%x: f32) {
  %tile = llvm.mlir.constant(4096 : i64) : i64
  %small = llvm.mlir.constant(32 : i64) : i64
  %a = llvm.alloca %tile x f32 : (i64) -> !llvm.ptr
  %b = llvm.alloca %tile x f32 : (i64) -> !llvm.ptr
  %c = llvm.alloca %small x f32 : (i64) -> !llvm.ptr
  %d = llvm.alloca %tile x f32 {alignment = 128 : i64} : (i64) -> !llvm.ptr
  llvm.store %x, %a : f32, !llvm.ptr
  llvm.store %x, %b : f32, !llvm.ptr
  llvm.store %x, %c : f32, !llvm.ptr
  llvm.store %x, %d : f32, !llvm.ptr
  llvm.return
}

// -----

// Tests that four buffers of 1 KiB take the slots 0, 1024, 2048 and 3072 modulo 4 KiB
// (spacing 4096 / 4): packed one after another they already do, so no padding.
// CHECK-LABEL: llvm.func @four_rows(
// CHECK: llvm.mlir.constant(4096 : i64) : i64
// CHECK: llvm.getelementptr %{{.*}}[0] : (!llvm.ptr) -> !llvm.ptr, i8
// CHECK: llvm.getelementptr %{{.*}}[1024] : (!llvm.ptr) -> !llvm.ptr, i8
// CHECK: llvm.getelementptr %{{.*}}[2048] : (!llvm.ptr) -> !llvm.ptr, i8
// CHECK: llvm.getelementptr %{{.*}}[3072] : (!llvm.ptr) -> !llvm.ptr, i8
llvm.func @four_rows(%x: f32) {
  %n = llvm.mlir.constant(256 : i64) : i64
  %a = llvm.alloca %n x f32 : (i64) -> !llvm.ptr
  %b = llvm.alloca %n x f32 : (i64) -> !llvm.ptr
  %c = llvm.alloca %n x f32 : (i64) -> !llvm.ptr
  %d = llvm.alloca %n x f32 : (i64) -> !llvm.ptr
  llvm.store %x, %a : f32, !llvm.ptr
  llvm.store %x, %b : f32, !llvm.ptr
  llvm.store %x, %c : f32, !llvm.ptr
  llvm.store %x, %d : f32, !llvm.ptr
  llvm.return
}
