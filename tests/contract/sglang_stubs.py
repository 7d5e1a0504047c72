"""Stand-ins for the GPU-only packages SGLang imports, so its Python runs on a CPU test machine.

Only GPU-only imports, and two that SGLang's argument, request and parser modules import without using, are
stubbed; every other dependency is the real package (the `dev` extra of pyproject.toml). transformers is real
and runs as on a machine without torch (tests/contract/sglang_side.py imports it before the stubs exist).

Stubbed import roots (everything below them too):
- `torch`, `torchvision`, `triton`: the stub `torch` answers as an 8-GPU H200 server (CUDA 12.9, compute
  capability 9.0, 141 GiB free of 141 GiB, no ROCm/NPU/XPU/MUSA/MPS attributes), so SGLang's platform
  discovery picks its CUDA platform and argument resolution sizes memory as on the servers we launch.
- `sgl_kernel`, `tvm_ffi`: SGLang's compiled kernels and their FFI; only imported.
- `xgrammar`, `compressed_tensors`: depend on torch; only imported (xgrammar's types appear in pydantic
  models, so a stub type validates as "any").
- `zmq`: the IPC transport between SGLang's processes; only imported.
- `IPython`: a debugging helper imported at module level.

Any other attribute of a stub is a stub class that can be subclassed, called, decorated with, indexed and
or-ed (type hints such as `torch.Tensor | None`), and is falsy; that is enough for module bodies to run.
"""

from __future__ import annotations

import abc
import importlib
import importlib.abc
import importlib.machinery
import inspect
import sys
import types
from collections.abc import Callable
from typing import Any

STUB_ROOTS: tuple[str, ...] = (
    "torch",
    "torchvision",
    "triton",
    "zmq",
    "IPython",
    "tvm_ffi",
    "compressed_tensors",
    "sgl_kernel",
    "xgrammar",
)

# The version SGLang 0.5.23 requires (`torch==2.14.1` in its wheel metadata); some modules compare it.
TORCH_VERSION = "2.14.1"
GPU_COUNT = 8
GPU_NAME = "NVIDIA H200"
GPU_CAPABILITY = (9, 0)
GPU_MEMORY_BYTES = 141 * 1024**3

# Backends SGLang probes with hasattr(torch, name): absent, so it never takes a non-CUDA branch.
ABSENT_ATTRIBUTES = frozenset({"npu", "hpu", "xpu", "musa", "mlu", "_npu", "mps"})


class _StubClass(abc.ABCMeta):
    """The type of every stub attribute: a class that tolerates whatever a module body does with it."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stub_class(f"{cls.__name__}.{name}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        # Used as a decorator (`@torch.compile`, `@triton.jit`): hand the function back unchanged.
        if len(args) == 1 and not kwargs and (inspect.isfunction(args[0]) or inspect.isclass(args[0])):
            return args[0]
        return _stub_class(f"{cls.__name__}()")

    def _same(cls, *other: Any) -> Any:
        return cls

    # Type hints (`torch.Tensor | None`) and module-level constants (`-torch.finfo(...).max`).
    __or__ = __ror__ = __neg__ = __pos__ = _same
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _same

    def __getitem__(cls, item: Any) -> Any:
        return cls

    def __iter__(cls) -> Any:
        return iter(())

    def __bool__(cls) -> bool:
        return False

    def __int__(cls) -> int:
        return 0

    def __float__(cls) -> float:
        return 0.0

    def __index__(cls) -> int:
        return 0

    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        # A stub type inside a pydantic model (`xgrammar.StructuralTag` in SGLang's OpenAI protocol) accepts anything.
        from pydantic_core import core_schema

        return core_schema.any_schema()


def _stub_class(name: str) -> type:
    return _StubClass(name, (), {})


def _torch_facts() -> dict[str, dict[str, Any]]:
    """The answers the stub `torch` gives, by module: those of the GPU servers our launcher targets."""
    return {
        "torch": {"__version__": TORCH_VERSION},
        "torch.version": {"cuda": "12.9", "hip": None, "git_version": "stub", "__version__": TORCH_VERSION},
        "torch.cuda": {
            "is_available": lambda: True,
            "device_count": lambda: GPU_COUNT,
            "get_device_name": lambda device=None: GPU_NAME,
            "get_device_capability": lambda device=None: GPU_CAPABILITY,
            "mem_get_info": lambda device=None: (GPU_MEMORY_BYTES, GPU_MEMORY_BYTES),
            "is_bf16_supported": lambda *a, **k: True,
            "current_device": lambda: 0,
            "get_device_properties": lambda device=None: types.SimpleNamespace(
                name=GPU_NAME,
                total_memory=GPU_MEMORY_BYTES,
                major=GPU_CAPABILITY[0],
                minor=GPU_CAPABILITY[1],
                multi_processor_count=132,
                uuid="GPU-stub",
            ),
        },
    }


class StubModule(types.ModuleType):
    """A package whose unknown attributes are stub classes, and whose known ones are `facts`."""

    def __init__(self, name: str, facts: dict[str, Any], submodules: frozenset[str]) -> None:
        super().__init__(name)
        self._submodules = submodules
        self.__path__: list[str] = []
        self.__version__ = TORCH_VERSION
        for key, value in facts.items():
            setattr(self, key, value)

    def __getattr__(self, name: str) -> Any:
        if (name.startswith("__") and name.endswith("__")) or name in ABSENT_ATTRIBUTES:
            raise AttributeError(name)
        qualified = f"{self.__name__}.{name}"
        # `torch.cuda.is_available()` without `import torch.cuda`: a submodule with facts is imported on use.
        if qualified in self._submodules:
            value: Any = importlib.import_module(qualified)
        else:
            value = _stub_class(qualified)
        setattr(self, name, value)
        return value


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports under STUB_ROOTS with StubModules; everything else is left to the real finders."""

    def __init__(self, facts: dict[str, dict[str, Any]]) -> None:
        self._facts = facts

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".")[0] not in STUB_ROOTS:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return StubModule(spec.name, self._facts.get(spec.name, {}), frozenset(self._facts))

    def exec_module(self, module: types.ModuleType) -> None:
        parent, _, child = module.__name__.rpartition(".")
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], child, module)


def install_stubs() -> Callable[[], None]:
    """Put the stub finder first on the import path; returns a function that removes it."""
    finder = StubFinder(_torch_facts())
    sys.meta_path.insert(0, finder)
    return lambda: sys.meta_path.remove(finder)
