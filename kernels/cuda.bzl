"""nvcc in a genrule (Bazel 4 has no CUDA rules), and a build with or without CUDA.

Whether this build has CUDA is @cuda's CUDA_AVAILABLE (third_party/cuda/cuda_configure.bzl:
the toolkit under /usr/local/cuda, unless --repo_env=ONEBIT_CUDA=off). Without it, the
nvcc objects and whatever includes a CUDA header are incompatible (requires_cuda: `bazel
build //...` skips them, naming one fails), and the libraries that the rest links (the
CUDA backend, the NCCL transport, the GPU workload) compile from stubs (if_cuda) whose
functions fail with a clear error.
"""

load("@cuda//:defs.bzl", "CUDA_AVAILABLE")

NVCC = "/usr/local/cuda/bin/nvcc"

# SASS for A100 (sm_80) and H100/H200 (sm_90), plus compute_90 PTX so that newer GPUs
# compile it at load time.
GENCODE = [
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
]

def if_cuda(if_true, if_false = []):
    """`if_true` in a build with CUDA, else `if_false`."""
    return if_true if CUDA_AVAILABLE else if_false

def requires_cuda():
    """target_compatible_with for targets that only build with CUDA."""
    return [] if CUDA_AVAILABLE else ["@platforms//:incompatible"]

def nvcc_object(name, src, hdrs = [], copts = [], testonly = False):
    """Compiles one .cu file into the position-independent object `name`.pic.o.

    Put the target in a cc_library's srcs (through if_cuda). `hdrs` are every header of
    this workspace the file includes (a genrule sees only what it lists).
    """
    native.genrule(
        name = name,
        testonly = testonly,
        srcs = [src] + hdrs,
        outs = [name + ".pic.o"],
        target_compatible_with = requires_cuda(),
        cmd = " ".join([
            NVCC,
            "-c $(location %s)" % src,
            "-o $@",
            "-I.",
            "-I$(GENDIR)",
            "-I/usr/include",
            "-std=c++17",
            "-O3",
            "-Xcompiler -fPIC",
            "-Xcompiler -Wall",
        ] + GENCODE + copts),
    )
