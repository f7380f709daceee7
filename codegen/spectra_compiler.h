/*===- spectra_compiler.h - the C API of libspectra-compiler --------------===*
 *
 * Plain C so the LibTorch runtime never includes MLIR or LLVM headers. MLIR
 * lives inside the shared library with hidden symbols; only spectra_* are
 * exported. Strings returned are owned by the caller: free them with
 * spectra_free. On failure the functions return NULL and set *error (if
 * error is not NULL) to a message saying what was wrong and where.
 *
 *===----------------------------------------------------------------------===*/

#ifndef SPECTRA_CODEGEN_SPECTRA_COMPILER_H
#define SPECTRA_CODEGEN_SPECTRA_COMPILER_H

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#define SPECTRA_API __attribute__((visibility("default")))
#else
#define SPECTRA_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* The numerics contract every kernel and the eager reference share (runtime/Reference.h):
 * keys are stabilised with one constant per feature, queries with one per query, and a
 * denominator with |den| <= SPECTRA_DENOMINATOR_GUARD * T, T = sum_f |phi(q)_f| zabs_f,
 * zabs_f = sum_j |phi(k_j)_f|, becomes den + 2 SPECTRA_DENOMINATOR_GUARD T. */
#define SPECTRA_DENOMINATOR_GUARD 1e-3

/* Rows per tile of the causal CPU kernels (spectra-cpu-pipeline's default for --causal; the
 * bidirectional kernels take 32), by the features F and the value head dv. Per row, a tile's
 * masked products cost about T (F + dv) and its state work (the carried summary's rescale and
 * update, once per tile) about F dv / T, so the best T grows with F dv / (F + dv): 8 rows below
 * 28 (d = 32, m = 128: 25.6), else 16 (d = 64: m = 128 42.7, m = 256 51.2). Measured in one
 * session on a 2-core AVX-512 machine, posrf-orf forward+backward: 8 rows 5% faster than 16 at
 * d = 32 m = 128, equal at d = 32 m = 256 (28.4), 16 rows 4% and 9% faster at d = 64. */
static inline long spectra_cpu_causal_tile_rows(long features, long value_dim) {
  return features * value_dim < 28 * (features + value_dim) ? 8 : 16;
}

/* Version of the compiler build: part of every cache key. */
SPECTRA_API const char *spectra_compiler_version(void);

/* Every named variant `<component>-<weights>`, comma-separated, the paper's 18 first
 * (Table 2's order), then the other combinations. */
SPECTRA_API const char *spectra_variant_names(void);

/* The JSON feature-map descriptor of a named variant `<component>-<weights>`.
 * `options` is "" or a comma-separated list NAME=VALUE (e.g. "a=-0.2"). */
SPECTRA_API char *spectra_describe_variant(const char *variant, int64_t m, int64_t d, int64_t seed,
                               const char *options, char **error);

/* The descriptor of a feature map declared in spectra IR text (built-in
 * library names resolve). `feature_map` may be NULL when the IR has exactly
 * one spectra.feature_map. `source_name` names the text in diagnostics. */
SPECTRA_API char *spectra_describe_ir(const char *ir, const char *source_name, const char *feature_map,
                          char **error);

SPECTRA_API void spectra_free(void *pointer);

/* The fused CPU kernels of a feature map (codegen/TileKernels.h: kv, readout,
 * query_backward, key_backward), compiled by spectra-cpu-pipeline for this host
 * and JIT-compiled. Specialised on m, d and the value dimension `dv` (0: d). With
 * `causal` non-zero, the causal kernel set instead (kv, kv_combine, causal_prefix,
 * causal_readout, causal_decode, causal_query_backward, causal_key_backward and the sums; refused with a message for
 * components whose parameters read sequence statistics); the same for the emulated and
 * GPU compile functions below. The same inputs as the describe functions; NULL and
 * *error on failure. */
typedef struct spectra_cpu_kernel spectra_cpu_kernel;
SPECTRA_API spectra_cpu_kernel *spectra_cpu_compile_variant(const char *variant, int64_t m,
                                                            int64_t d, int64_t seed,
                                                            const char *options, int64_t dv, int causal,
                                                            char **error);
SPECTRA_API spectra_cpu_kernel *spectra_cpu_compile_ir(const char *ir, const char *source_name,
                                                       const char *feature_map, int64_t dv, int causal,
                                                       char **error);
/* A kernel's C entry point by kind ("kv", "kv_combine", "readout", "query_backward",
 * "dsummary_combine", "key_backward", "dweights_chunk_combine", "dweights_combine",
 * "dparams_combine"; "moments", "moments_combine", "moments_params",
 * "moments_params_backward", "moments_backward" for components whose parameters read data
 * statistics; the two params kinds only where their program lowers, see TileKernels.h):
 * void (*)(StridedMemRef *...) in the argument order of
 * codegen/TileKernels.h (spectra_cpu_kernel_abi), memrefs as MLIR lays them
 * out ({allocated, aligned, offset, sizes[R], strides[R]}; f32, or the rows'
 * bf16/f16 in the emulated GPU kernels). NULL when missing; *why then says
 * why (a component that could not be differentiated has no backward). */
SPECTRA_API void *spectra_cpu_kernel_entry(spectra_cpu_kernel *kernel, const char *kind,
                                           const char **why);
/* A kernel's ABI, generated from its signature (codegen/TileKernels.h): "grid=RULE;"
 * ("chunk_rows=N;" for the mapped GPU kernels, "chunks=partials;" for those whose chunk
 * count is their partial sums', "tile_rows=N;" where known), then "NAME:ROLE:RANK:ELEMENT;" per
 * argument in order (ELEMENT: f32, bf16, f16). Cached objects carry it. "" for an
 * unknown kind. */
SPECTRA_API const char *spectra_cpu_kernel_abi(spectra_cpu_kernel *kernel, const char *kind);
/* The kernel's IR at a stage of spectra-cpu-pipeline: "tiles", "vectors" or "llvm". */
SPECTRA_API const char *spectra_cpu_kernel_ir(spectra_cpu_kernel *kernel, const char *stage);
/* The vector work per row tile of each CPU kernel of a variant (the vector stage of
 * spectra-cpu-pipeline for this host; codegen/KernelWork.h), one line per kernel:
 * "KIND tile_rows=.. width=.. fma=.. exp=.. exp_ops=.. other=.. load=.. store=.. if_fma=..
 * if_exp=.. if_other=.. if_load=.. if_store=.. bound=.. if_bound=.. exact=0|1": the
 * contractions' vector FMAs, the exponentials and the vector operations each becomes, every
 * other vector operation, loads and stores; if_*: the work only done when W is learnable;
 * bound: fma / (fma + exp x exp_ops + other), the share of the FMA peak the kernel could
 * reach if every vector operation took an FMA port's cycle. Free with spectra_free; NULL and
 * *error on failure. */
SPECTRA_API char *spectra_cpu_work_variant(const char *variant, int64_t m, int64_t d,
                                           int64_t seed, const char *options, int64_t dv,
                                           int causal, char **error);
/* What the JIT compiles for: triple, host CPU and vector width (part of cache keys). */
SPECTRA_API const char *spectra_cpu_host_target(void);
/* 1 where the CPU kernels compiled now run their contractions on AMX tiles (SPECTRA_CPU_AMX=1
 * on a host with AMX whose tile state Linux granted), else 0; read at each call. */
SPECTRA_API int spectra_cpu_amx(void);

/* How the GPU kernels (and their emulation) compile contractions with bf16/f16 inputs, from
 * the environment variable SPECTRA_MMA, read at each call: "bf16x3" (unset: the default,
 * tensor cores with split operands), "bf16" (tensor cores, operands rounded once), "f16"
 * (operands rounded to f16) or "none" (FMA). Another value is ignored with a warning on stderr (once). Cache keys include it. */
SPECTRA_API const char *spectra_gpu_mma_mode(void);
SPECTRA_API void spectra_cpu_kernel_free(spectra_cpu_kernel *kernel);
/* The kernel's relocatable object (owned by the kernel; *size bytes), for a
 * disk cache; and the kernels of `feature_map` loaded from such an object
 * (plus the IR stages stored with it), without compiling. */
SPECTRA_API const char *spectra_cpu_kernel_object(spectra_cpu_kernel *kernel, size_t *size);
SPECTRA_API spectra_cpu_kernel *spectra_cpu_load_object(const char *data, size_t size,
                                                        const char *feature_map,
                                                        const char *tiles_ir,
                                                        const char *vectors_ir,
                                                        const char *llvm_ir, char **error);

/* The GPU kernels of a feature map run on the CPU (the gpu-emulated device): the
 * GPU-mapped IR (codegen/MapTilesToGpu.h, the stage the PTX is lowered from) with
 * blocks and threads as loops, JIT-compiled for this host. q/k/v of `dtype` "f32",
 * "bf16" or "f16"; arguments batched by role (codegen/TileKernels.h, "The kernel
 * ABI"); entries by kind as spectra_cpu_kernel_entry gives them: kv, kv_combine,
 * readout, query_backward, dsummary_combine, key_backward, dweights_chunk_combine,
 * dweights_combine, dparams_combine (and the statistics' moments kinds). Stages "mapped"
 * and "llvm". */
SPECTRA_API spectra_cpu_kernel *spectra_emulated_compile_variant(const char *variant, int64_t m,
                                                                 int64_t d, int64_t seed,
                                                                 const char *options,
                                                                 const char *dtype, int64_t dv, int causal,
                                                                 char **error);
SPECTRA_API spectra_cpu_kernel *spectra_emulated_compile_ir(const char *ir, const char *source_name,
                                                            const char *feature_map,
                                                            const char *dtype, int64_t dv, int causal,
                                                            char **error);

/* Lower-case hex SHA-256 of `size` bytes (cache keys and entry checksums). */
SPECTRA_API char *spectra_sha256_hex(const void *data, size_t size);

/* The fused GPU kernels of a named variant (or of a feature map in IR text)
 * for `target` "sm_80" or "sm_90a", with q/k/v of `dtype` "f32", "bf16" or
 * "f16" (f32 accumulation) and value dimension `dv` (0: d): the tile kernels
 * through spectra-gpu-pipeline. Returns the KernelArtifact as JSON (version
 * 3): "kernels", the launch description generated from the outlined kernels
 * (per kernel its kind, symbol, grid rule, rows per block, threads, static
 * shared bytes and its arguments in launch order with role, rank and element
 * type; the same kinds and roles as spectra_cpu_kernel_abi), and the PTX text
 * ("ptx"). Needs no GPU. */
SPECTRA_API char *spectra_gpu_compile_variant(const char *variant, int64_t m, int64_t d,
                                              int64_t seed, const char *options,
                                              const char *target, const char *dtype, int64_t dv, int causal,
                                              char **error);
SPECTRA_API char *spectra_gpu_compile_ir(const char *ir, const char *source_name,
                                         const char *feature_map, const char *target,
                                         const char *dtype, int64_t dv, int causal, char **error);

#ifdef __cplusplus
}
#endif

#endif /* SPECTRA_CODEGEN_SPECTRA_COMPILER_H */
