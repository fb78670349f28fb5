"""The @cuda repository: the CUDA toolkit under /usr/local/cuda, or a build without CUDA.

With /usr/local/cuda/bin/nvcc present, @cuda links the toolkit's include/ and lib64/ and
has the targets of BUILD.cuda; its defs.bzl says CUDA_AVAILABLE = True. Without nvcc, or
with ONEBIT_CUDA=off, it has the same targets, empty (BUILD.no_cuda), and
CUDA_AVAILABLE = False: the BUILD files then compile the CUDA backend, the NCCL transport
and the GPU workload as stubs that fail with a clear error (kernels/cuda.bzl: if_cuda,
requires_cuda). ONEBIT_CUDA=on makes a missing toolkit an error instead.

    bazel build --repo_env=ONEBIT_CUDA=off //python:wheel     # a wheel for CPUs only

Nothing is downloaded. The rule runs again when ONEBIT_CUDA changes and at every Bazel
server start (local = True), so a toolkit installed or removed later is seen.
"""

_CUDA = "/usr/local/cuda"

def _cuda_configure_impl(ctx):
    mode = ctx.os.environ.get("ONEBIT_CUDA", "auto")
    if mode not in ("auto", "on", "off"):
        fail("ONEBIT_CUDA is %r: use on, off or auto (the default)" % mode)
    nvcc = ctx.path(_CUDA + "/bin/nvcc")
    if mode == "on" and not nvcc.exists:
        fail("ONEBIT_CUDA=on, but %s is missing: install CUDA 13 there" % nvcc)
    available = mode != "off" and nvcc.exists
    if available:
        for d in ("include", "lib64"):
            ctx.symlink(_CUDA + "/" + d, d)
        ctx.symlink(ctx.path(ctx.attr._build_cuda), "BUILD.bazel")
        why = "found %s" % nvcc
    else:
        ctx.symlink(ctx.path(ctx.attr._build_no_cuda), "BUILD.bazel")
        why = "ONEBIT_CUDA=off" if mode == "off" else "%s not found" % nvcc
    ctx.file("defs.bzl", "\n".join([
        '"""Made by //third_party/cuda:cuda_configure.bzl (%s)."""' % why,
        "",
        "CUDA_AVAILABLE = %s" % available,
        "",
    ]))
    ctx.file("WORKSPACE", 'workspace(name = "cuda")\n')

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["ONEBIT_CUDA"],
    local = True,
    attrs = {
        "_build_cuda": attr.label(default = "//third_party/cuda:BUILD.cuda"),
        "_build_no_cuda": attr.label(default = "//third_party/cuda:BUILD.no_cuda"),
    },
)
