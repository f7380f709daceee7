# lit configuration of the spectra test suite.
import os
import sys
import shutil

import lit.formats
from lit.llvm import llvm_config

config.name = "Spectra"
# The internal shell: portable, and the only one newer lit versions keep.
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.spectra_obj_root, "test")
config.excludes = ["Inputs", "scripts", "CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "Unit"]

config.substitutions.append(("%PATH%", config.environment["PATH"]))
config.substitutions.append(("%spectra_src", config.spectra_src_root))
config.substitutions.append(("%spectra_tools", config.spectra_tools_dir))
config.substitutions.append(("%python", config.python_executable or "python3"))
# Variables must be re-captured in every CHECK-LABEL block (IREE, CIRCT).
config.environment["FILECHECK_OPTS"] = "--enable-var-scope"

llvm_config.with_system_environment(["HOME", "TMP", "TEMP", "OMP_WAIT_POLICY"])
llvm_config.use_default_substitutions()
tool_dirs = [config.spectra_tools_dir, config.llvm_tools_dir]
llvm_config.add_tool_substitutions(["spectra-opt", "spectra-compile", "spectra-train"], tool_dirs)
# LLVM 22's, not an older llc on PATH (Debian's default llvm).
llvm_config.add_tool_substitutions(["llc", "mlir-translate"], [config.llvm_tools_dir])
# spectra-eval is a LibTorch tool: built only with SPECTRA_ENABLE_TORCH.
if os.path.exists(os.path.join(config.spectra_tools_dir, "spectra-eval")):
    config.available_features.add("spectra-eval")
    llvm_config.add_tool_substitutions(["spectra-eval", "spectra-bench"], tool_dirs)
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)
# The LRA stand-in data beside the checkout (../shared/data), when present.
standin = os.path.join(os.path.dirname(config.spectra_src_root), "shared", "data", "lra-standin.tar.gz")
if os.path.exists(standin):
    config.available_features.add("lra-standin")
    config.substitutions.append(("%lra_standin", standin))

# torch.ops.spectra for Python (a LibTorch build).
config.substitutions.append(("%spectra_lib", os.path.join(config.spectra_obj_root, "lib")))
if os.path.exists(os.path.join(config.spectra_obj_root, "lib", "libspectra_torch_ops.so")):
    config.available_features.add("torch-ops")
# performer-pytorch, the peers' benchmark (an optional, test-only dependency).
python = config.python_executable or "python3"
if "torch-ops" in config.available_features and os.system(
        f"'{python}' -c 'import performer_pytorch' > /dev/null 2>&1") == 0:
    config.available_features.add("performer-pytorch")
# nvdisasm (the CUDA toolkit's or PyPI nvidia-cuda-nvdisasm's) for SASS counts.
if os.path.exists("/usr/local/cuda/bin/nvdisasm") or os.system(
        f"'{python}' -c 'import nvidia.cu13, os, sys; "
        f"sys.exit(not os.path.exists(os.path.join(list(nvidia.cu13.__path__)[0], \"bin\", \"nvdisasm\")))'"
        " > /dev/null 2>&1") == 0:
    config.available_features.add("nvdisasm")
# AVX-512F and AVX2 on this machine (each exp form runs only where its instructions are) and
# mlir-runner to run them.
try:
    with open("/proc/cpuinfo") as f:
        flags = f.read()
        if " avx512f" in flags:
            config.available_features.add("avx512f")
        if " avx2" in flags:
            config.available_features.add("avx2")
        if " amx_tile" in flags and " amx_bf16" in flags:
            config.available_features.add("amx-bf16")
except OSError:
    pass
if os.path.exists(os.path.join(config.llvm_tools_dir, "mlir-runner")):
    config.available_features.add("mlir-runner")
    config.substitutions.append(
        ("%mlir_runner_utils", os.path.join(os.path.dirname(config.llvm_tools_dir), "lib",
                                            "libmlir_c_runner_utils.so")))
# Kernels compiled by the tests are cached in the build tree, never in the user's cache.
config.environment["SPECTRA_CACHE_DIR"] = os.path.join(config.spectra_obj_root, "test-kernel-cache")

# GPU integration tests need a device; the PTX tests need only ptxas.
if shutil.which("nvidia-smi") and os.system("nvidia-smi -L > /dev/null 2>&1") == 0:
    config.available_features.add("cuda-device")
ptxas = shutil.which("ptxas") or ("/usr/local/cuda/bin/ptxas" if os.path.exists("/usr/local/cuda/bin/ptxas") else None)
if ptxas:
    config.available_features.add("ptxas")
    config.substitutions.append(("%ptxas", ptxas))
    # The toolkit whose libdevice the GPU lowering links (ptxas sits in its bin/).
    config.substitutions.append(("%cuda_home", os.path.dirname(os.path.dirname(os.path.realpath(ptxas)))))
