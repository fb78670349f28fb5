"""C++ protobuf + gRPC code from one .proto with Debian's protoc and grpc_cpp_plugin."""

def cc_grpc_library(name, src, deps = []):
    """Generates <base>.pb.{h,cc} and <base>.grpc.pb.{h,cc} and a cc_library `name`.

    `src` is a path inside this package (e.g. onebit/v1/x.proto); the generated headers are
    included as "onebit/v1/x.pb.h".
    """
    base = src[:-len(".proto")]
    outs = [base + ".pb.h", base + ".pb.cc", base + ".grpc.pb.h", base + ".grpc.pb.cc"]
    native.genrule(
        name = name + "_gen",
        srcs = [src],
        outs = outs,
        # Paths inside the package are the import paths (onebit/v1/x.proto).
        cmd = ("protoc --proto_path=proto --cpp_out=$(GENDIR)/proto --grpc_out=$(GENDIR)/proto " +
               "--plugin=protoc-gen-grpc=$$(which grpc_cpp_plugin) proto/{src}").format(src = src),
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc", base + ".grpc.pb.cc"],
        hdrs = [base + ".pb.h", base + ".grpc.pb.h"],
        strip_include_prefix = "",
        includes = ["."],
        deps = deps + ["//:grpc"],
    )
