"""The native core as the optimizers use it: onebit/_native.py over libonebit_core.so,
loaded at its first use (never at import), or an ImportError that says what to do: the
Debian package of a missing shared library, or how to install or build the core."""

# The Debian packages of the shared libraries the extension loads (the wheel's METADATA
# says the same, as Requires-External), to name the one to install when a library is missing.
_DEBIAN_PACKAGES = {
    "libabsl": "libabsl20220623", "libgrpc++": "libgrpc++1.51", "libgrpc.": "libgrpc29",
    "libgpr": "libgrpc29", "libupb": "libgrpc29", "libaddress_sorting": "libgrpc29",
    "libprotobuf": "libprotobuf32", "libgloo": "libgloo0",
    "libprometheus-cpp-core": "libprometheus-cpp-core1.0",
    "libprometheus-cpp-pull": "libprometheus-cpp-pull1.0",
    "libcpp-httplib": "libcpp-httplib0.11", "libcivetweb": "libcivetweb1",
    "libssl": "libssl3", "libcrypto": "libssl3", "libz.": "zlib1g",
}


def _missing_library_hint(message):
    """What to do about an ImportError that names a shared library, or None."""
    import re  # noqa: PLC0415
    m = re.search(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file", message)
    if not m:
        return None
    library = m.group(1)
    if library.startswith("libnccl"):
        return (f"{library} is missing: onebit needs NCCL 2 (CUDA 13's, under /usr/local/cuda; "
                "its lib directory must be known to the dynamic loader, e.g. in ld.so.conf)")
    for prefix, package in _DEBIAN_PACKAGES.items():
        if library.startswith(prefix):
            return f"{library} is missing: apt-get install {package}"
    return f"{library} is missing (see the wheel's Requires-External)"


def _core():
    """The native core (onebit/_native.py over libonebit_core.so), loaded at first use."""
    from onebit import _native  # noqa: PLC0415
    try:
        _native.lib()
    except OSError as e:
        hint = _missing_library_hint(str(e))
        raise ImportError(f"onebit's native core cannot load: {hint or e}") from e
    except ImportError as e:
        raise ImportError(
            f"{e}: pip install the wheel (bash python/wheel/build.sh), or build it with "
            "`bazel build //python:libonebit_core.so` and put bazel-bin/python on PYTHONPATH "
            "(onebit-launch does)") from e
    return _native
