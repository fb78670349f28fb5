"""nvcc in a genrule: Bazel 4 has no CUDA rules, and the toolkit is preinstalled."""

NVCC = "/usr/local/cuda/bin/nvcc"

# SASS for A100 (sm_80) and H100/H200 (sm_90), plus compute_90 PTX so that newer GPUs
# compile it at load time.
GENCODE = [
    "-gencode arch=compute_80,code=sm_80",
    "-gencode arch=compute_90,code=sm_90",
    "-gencode arch=compute_90,code=compute_90",
]

def nvcc_object(name, src, hdrs = [], copts = [], testonly = False):
    """Compiles one .cu file into the position-independent object `name`.pic.o.

    Put the target in a cc_library's srcs. `hdrs` are every header of this workspace the
    file includes (a genrule sees only what it lists).
    """
    native.genrule(
        name = name,
        testonly = testonly,
        srcs = [src] + hdrs,
        outs = [name + ".pic.o"],
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
