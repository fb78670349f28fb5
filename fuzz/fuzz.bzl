"""libFuzzer targets built with clang, beside a gcc default toolchain.

Bazel 4's cc rules use the default toolchain (gcc here), and gcc has no libFuzzer. So a
fuzzer is built by this rule instead: an aspect walks the `deps` of the fuzzer through
cc_library targets and compiles each library's sources once with clang and the sanitizers
(ASan, UBSan, libFuzzer coverage), from what the library itself declares: its sources, its
copts, and its CcInfo's headers, defines and include paths. The fuzzer rule compiles its own
source the same way and links every object with clang -fsanitize=fuzzer plus the libraries'
linkopts (Debian's shared abseil, protobuf, gRPC, ...; they were built by gcc against the
same libstdc++). Nothing in BUILD files elsewhere changes, and the objects of a library
that several fuzzers use are compiled once.

Every clang call goes through clang.sh, which fails with a clear message where clang or its
libFuzzer runtime is missing.
"""

_SANITIZE = [
    "-fsanitize=address,undefined",
    # Undefined behaviour is a crash, not a line on stderr the fuzzer would ignore.
    "-fno-sanitize-recover=all",
]

_COMPILE_FLAGS = [
    "-std=c++17",
    "-O1",
    "-gline-tables-only",
    "-fno-omit-frame-pointer",
    "-fsanitize=fuzzer-no-link",
    "-Wno-unused-command-line-argument",
] + _SANITIZE

_LINK_FLAGS = [
    "-fsanitize=fuzzer",
] + _SANITIZE

# Flags for single sources. clang ignores `#pragma GCC target`, by which the AVX2 kernels
# file enables AVX2 for itself; give clang the same through flags. Only functions that
# cpu_backend.cc calls after checking the CPU live in that file.
_SOURCE_COPTS = {
    "kernels/cpu_kernels_avx2.cc": ["-mavx2", "-mfma"],
}

_CC_EXTENSIONS = ["cc", "cpp", "cxx", "c"]
_HDR_EXTENSIONS = ["h", "hh", "hpp", "inc"]

ClangObjectsInfo = provider(
    doc = "clang-compiled objects of a cc_library and everything it depends on",
    fields = {
        "objects": "depset of File: .o files",
    },
)

def _compile(ctx, wrapper, src, out, cc_info, headers, copts):
    cctx = cc_info.compilation_context
    args = ctx.actions.args()
    args.add_all(_COMPILE_FLAGS)
    args.add_all(copts)
    args.add_all(cctx.defines, format_each = "-D%s")
    args.add_all(cctx.local_defines, format_each = "-D%s")
    args.add_all(cctx.quote_includes, before_each = "-iquote")
    args.add_all(cctx.includes, before_each = "-I")
    args.add_all(cctx.system_includes, before_each = "-isystem")
    args.add("-c", src)
    args.add("-o", out)
    ctx.actions.run(
        executable = wrapper,
        arguments = [args],
        inputs = depset([src] + headers, transitive = [cctx.headers]),
        outputs = [out],
        mnemonic = "ClangFuzzCompile",
        progress_message = "Compiling %s with clang for fuzzing" % src.short_path,
        use_default_shell_env = True,
    )

def _linkopts(cc_info):
    flags = []
    for linker_input in cc_info.linking_context.linker_inputs.to_list():
        flags.extend(linker_input.user_link_flags)
    return flags

def _clang_objects_aspect_impl(target, ctx):
    transitive_objects = []
    for dep in getattr(ctx.rule.attr, "deps", []):
        if ClangObjectsInfo in dep:
            transitive_objects.append(dep[ClangObjectsInfo].objects)
    objects = []
    if ctx.rule.kind == "cc_library" and CcInfo in target:
        srcs = getattr(ctx.rule.files, "srcs", [])
        private_headers = [f for f in srcs if f.extension in _HDR_EXTENSIONS]
        copts = getattr(ctx.rule.attr, "copts", [])
        for src in srcs:
            if src.extension not in _CC_EXTENSIONS:
                continue
            out = ctx.actions.declare_file("_clang_fuzz/%s/%s.o" % (ctx.label.name, src.short_path))
            _compile(
                ctx,
                ctx.executable._clang,
                src,
                out,
                target[CcInfo],
                private_headers,
                copts + _SOURCE_COPTS.get(src.short_path, []),
            )
            objects.append(out)
    return [ClangObjectsInfo(objects = depset(objects, transitive = transitive_objects))]

clang_objects_aspect = aspect(
    implementation = _clang_objects_aspect_impl,
    attr_aspects = ["deps"],
    attrs = {
        "_clang": attr.label(
            default = Label("//fuzz:clang.sh"),
            executable = True,
            cfg = "exec",
            allow_single_file = True,
        ),
    },
)

def _clang_fuzzer_impl(ctx):
    cc_info = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    main_object = ctx.actions.declare_file("_clang_fuzz/%s/%s.o" % (ctx.label.name, ctx.label.name))
    _compile(ctx, ctx.executable._clang, ctx.file.src, main_object, cc_info, ctx.files.hdrs, [])

    objects = depset([main_object], transitive = [d[ClangObjectsInfo].objects for d in ctx.attr.deps])
    # The libraries' own linkopts (-labsl_..., -lprotobuf, -lz, ...), in the order the cc
    # rules would pass them, each once.
    linkopts = []
    for flag in _linkopts(cc_info) + ctx.attr.linkopts:
        if flag not in linkopts:
            linkopts.append(flag)

    binary = ctx.actions.declare_file(ctx.label.name)
    args = ctx.actions.args()
    args.add_all(_LINK_FLAGS)
    args.add_all(objects)
    args.add_all(linkopts)
    args.add("-o", binary)
    ctx.actions.run(
        executable = ctx.executable._clang,
        arguments = [args],
        inputs = objects,
        outputs = [binary],
        mnemonic = "ClangFuzzLink",
        progress_message = "Linking fuzzer %s" % ctx.label,
        use_default_shell_env = True,
    )
    return [DefaultInfo(executable = binary, files = depset([binary]))]

clang_fuzzer = rule(
    implementation = _clang_fuzzer_impl,
    doc = "A libFuzzer binary: `src` defines LLVMFuzzerTestOneInput; `deps` are cc_library targets.",
    executable = True,
    attrs = {
        "src": attr.label(allow_single_file = [".cc"], mandatory = True),
        "hdrs": attr.label_list(allow_files = [".h"]),
        "deps": attr.label_list(providers = [CcInfo], aspects = [clang_objects_aspect]),
        "linkopts": attr.string_list(),
        "_clang": attr.label(
            default = Label("//fuzz:clang.sh"),
            executable = True,
            cfg = "exec",
            allow_single_file = True,
        ),
    },
)
