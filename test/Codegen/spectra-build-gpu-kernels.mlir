// RUN: spectra-opt %s -spectra-build-gpu-kernels | FileCheck %s
// RUN: spectra-opt %s -spectra-build-gpu-kernels="dtype=bf16" | FileCheck %s --check-prefix=BF16
// RUN: spectra-opt %s -spectra-build-gpu-kernels -spectra-gpu-lowering="chip=sm_80 binary=false" | FileCheck %s --check-prefix=NVVM
// RUN: not spectra-opt %s -spectra-build-gpu-kernels="dtype=f64" 2>&1 | FileCheck %s --check-prefix=BAD

// Tests that a feature map becomes one gpu.module of six kernels with the
// features region inlined (math.exp of the logit minus a stabiliser), the key
// constants as one atomic max per feature and block into shift [BH, features],
// the inputs scaled in f32 after loading (qscale/kscale [BH, d]), the phi tile
// in shared (workgroup) memory only, sequence chunks combined by atomic adds
// (S, z and zabs), the readout's denominator guard counted per slice, and the
// backward built from the derived partials. No kernel allocates a global buffer.
// The launch description (the runtime's artifact) is recorded on the module.
// CHECK: module attributes {gpu.container_module, spectra.gpu_artifacts = {posrf_orf = "{{.*}}\22feature_map\22:\22posrf_orf\22{{.*}}\22name\22:\22posrf_orf_kv_summary\22,\22shared_bytes\22:4672
// CHECK: spectra.feature_partials @posrf_partials of @posrf
// CHECK: gpu.module @posrf_orf_kernels
// CHECK-NOT: memref.alloc
// CHECK-LABEL: gpu.func @posrf_orf_key_max(
// CHECK-SAME: memref<?x?x8xf32>, %{{.*}}: memref<?x?xf32>, %{{.*}}: memref<16x8xf32>, %{{.*}}: memref<?x1xf32>, %{{.*}}: memref<?x16xf32>, %[[KSCALE:.*]]: memref<?x8xf32>, %{{.*}}: index)
// CHECK-SAME: kernel attributes {known_block_size = array<i32: 128, 1, 1>}
// CHECK: memref.load %[[KSCALE]]
// CHECK: arith.maximumf
// CHECK: memref.atomic_rmw maximumf %{{.*}} : (f32, memref<?x16xf32>) -> f32
// CHECK-LABEL: gpu.func @posrf_orf_kv_summary(
// CHECK-SAME: workgroup(
// CHECK-SAME: memref<16x33xf32, #gpu.address_space<workgroup>>
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// CHECK: gpu.barrier
// CHECK: math.exp
// CHECK: memref.store %{{.*}}, %{{.*}} : memref<16x33xf32, #gpu.address_space<workgroup>>
// CHECK: memref.atomic_rmw addf %{{.*}} : (f32, memref<?x16x8xf32>) -> f32
// CHECK: memref.atomic_rmw addf %{{.*}} : (f32, memref<?x16xf32>) -> f32
// CHECK: memref.atomic_rmw addf %{{.*}} : (f32, memref<?x16xf32>) -> f32
// CHECK-LABEL: gpu.func @posrf_orf_readout(
// CHECK: math.exp
// CHECK: arith.cmpf ule
// CHECK: arith.divf
// CHECK: memref.atomic_rmw addf %{{.*}} : (f32, memref<?xf32>) -> f32
// CHECK-LABEL: gpu.func @posrf_orf_query_backward(
// CHECK: gpu.shuffle xor
// CHECK: memref.atomic_rmw addf %{{.*}} : (f32, memref<?x16x8xf32>) -> f32
// CHECK-LABEL: gpu.func @posrf_orf_dsummary(
// CHECK-SAME: workgroup(
// CHECK-LABEL: gpu.func @posrf_orf_key_backward(
// CHECK-NOT: memref.alloc
// CHECK: gpu.return

// Tests that bf16 inputs are widened to f32 on load and the output narrowed on store.
// BF16-LABEL: gpu.func @posrf_orf_key_max(%{{.*}}: memref<?x?x8xbf16>
// BF16: arith.extf %{{.*}} : bf16 to f32
// BF16-LABEL: gpu.func @posrf_orf_readout(
// BF16: arith.truncf %{{.*}} : f32 to bf16

// Tests that the lowering attaches the NVVM target and reaches NVVM ops
// (warp shuffles, barriers, libdevice exp) with no gpu or scf ops left.
// NVVM: gpu.module @posrf_orf_kernels [#nvvm.target<O = 3, chip = "sm_80", features = "+ptx80">]
// NVVM-NOT: scf.for
// NVVM: llvm.func @posrf_orf_key_max(
// NVVM: llvm.atomicrmw fmax
// NVVM: llvm.func @posrf_orf_kv_summary(
// NVVM: nvvm.barrier
// NVVM: llvm.func @posrf_orf_query_backward(
// NVVM: nvvm.shfl.sync bfly
// NVVM-NOT: gpu.barrier

// BAD: error: 'spectra.feature_map' op GPU kernels: unsupported dtype 'f64' (supported: f32, bf16, f16)
spectra.feature_map @posrf_orf component @posrf weights @orf m = 16 d = 8 seed = 0
