"""Builds ruccl_pg: the Python package and its extension ruccl_pg._C (the C++ shim
in csrc/torch, linked with the ruCCL C core).

The C core is built first by CMake (target ruccl_static), then the shim by torch's
cpp_extension against the *installed* torch, so install without build isolation:

    pip install --no-build-isolation .          # or: python setup.py build_ext --inplace

It needs cmake, ninja (else make), a C/C++ compiler and OpenSSL's libcrypto headers
(scripts/setup.sh installs them on Debian/Ubuntu).

CUDA: when the installed torch has CUDA (torch.version.cuda) and nvcc is found
(CUDA_HOME, or nvcc on PATH), the core is built with its CUDA adapter
(-DRUCCL_CUDA=ON, in build/torch-core-cuda; RUCCL_CUDA_ARCHS passes through) and the
shim with CUDA (RUCCL_TORCH_CUDA: CUDA tensors go to the core as they are), linked
with cudart.  Otherwise the core is built without it (build/torch-core) and CUDA
tensors are copied through host memory.  RUCCL_CUDA=0 forces the CPU-only build;
RUCCL_CUDA=1 requires the CUDA one (and fails saying what is missing).
ruccl_pg.built_with_cuda() tells which one was built.
"""
import os
import shutil
import subprocess
import sys

import torch
from setuptools import setup
from torch.utils import cpp_extension
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def find_nvcc():
    """nvcc under CUDA_HOME (torch's idea of it, else the environment's), else on PATH."""
    for home in (getattr(cpp_extension, "CUDA_HOME", None), os.environ.get("CUDA_HOME"),
                 os.environ.get("CUDA_PATH")):
        if home and os.path.isfile(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def want_cuda():
    """(build with CUDA?, nvcc) from RUCCL_CUDA (0, 1, or unset/auto) and what is installed."""
    mode = os.environ.get("RUCCL_CUDA", "").strip().lower()
    if mode in ("0", "off", "no", "false"):
        return False, None
    if mode not in ("", "auto", "1", "on", "yes", "true"):
        sys.exit(f"setup.py: RUCCL_CUDA={mode!r}: use 1 (require CUDA), 0 (CPU only) or leave it unset (auto)")
    nvcc = find_nvcc()
    missing = []
    if torch.version.cuda is None:
        missing.append(f"the installed torch {torch.__version__} has no CUDA")
    if nvcc is None:
        missing.append("nvcc is not found (set CUDA_HOME, or put nvcc on PATH)")
    if mode in ("1", "on", "yes", "true") and missing:
        sys.exit("setup.py: RUCCL_CUDA=1 but " + "; ".join(missing))
    return not missing, nvcc


WITH_CUDA, NVCC = want_cuda()
CORE_BUILD = os.path.join(ROOT, "build", "torch-core-cuda" if WITH_CUDA else "torch-core")
CORE_LIB = os.path.join(CORE_BUILD, "libruccl.a")


def core_cmake_args():
    args = ["-DRUCCL_TESTS=OFF", "-DRUCCL_EXAMPLES=OFF", "-DRUCCL_ORCHESTRATOR=ON"]
    if not WITH_CUDA:
        return args + ["-DRUCCL_CUDA=OFF"]
    args += ["-DRUCCL_CUDA=ON", f"-DCMAKE_CUDA_COMPILER={NVCC}"]
    if os.environ.get("RUCCL_CUDA_ARCHS"):
        args.append(f"-DRUCCL_CUDA_ARCHS={os.environ['RUCCL_CUDA_ARCHS']}")
    return args


class BuildWithCore(BuildExtension):
    """Configures and builds the C core (incrementally) before the extension."""

    def run(self):
        # Ninja, else (a machine without it) Makefiles; a directory keeps the one it has.
        made = [g for g, f in (("Ninja", "build.ninja"), ("Unix Makefiles", "Makefile"))
                if os.path.exists(os.path.join(CORE_BUILD, f))]
        if not made:
            generator = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
            subprocess.check_call(
                ["cmake", "-S", ROOT, "-B", CORE_BUILD, "-G", generator, "-DCMAKE_BUILD_TYPE=Release",
                 *core_cmake_args()])
        subprocess.check_call(["cmake", "--build", CORE_BUILD, "--target", "ruccl_static"])
        super().run()


def extension():
    kwargs = dict(
        name="ruccl_pg._C",
        # the shim, one concern a file (see csrc/torch/ProcessGroupRuccl.cpp); module.cpp is the entry
        sources=[f"csrc/torch/{f}.cpp" for f in ("tensors", "streams", "flight_recorder", "work", "rendezvous",
                                                  "ProcessGroupRuccl", "collectives", "p2p", "shrink", "module")],
        include_dirs=[os.path.join(ROOT, "include")],
        extra_objects=[CORE_LIB],
        libraries=["crypto"],
        extra_compile_args=["-O2", "-Wall", "-Wno-unused-parameter"],
    )
    if not WITH_CUDA:
        return CppExtension(**kwargs)
    # CUDAExtension adds CUDA's and torch's CUDA include dirs and links cudart,
    # c10_cuda and torch_cuda; the core's CUDA adapter needs cudart too (the static
    # core comes first on the link line).
    kwargs["define_macros"] = [("RUCCL_TORCH_CUDA", "1")]
    kwargs["libraries"] = ["crypto", "cudart"]
    return cpp_extension.CUDAExtension(**kwargs)


setup(
    name="ruccl_pg",
    version="0.1.0",
    description="ruCCL collective communication as a torch.distributed backend",
    packages=["ruccl_pg"],
    ext_modules=[extension()],
    cmdclass={"build_ext": BuildWithCore},
    python_requires=">=3.9",
)
