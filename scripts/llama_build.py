"""Says which CPU kernels the installed llama-cpp-python was built with, and fails when they are
the processor-specific ones the Makefile builds without (AVX-512, AMX): a native build on a Xeon
with AMX killed the test model server at its first prompt (issue 39)."""
from __future__ import annotations

import re
import sys

NOT_PORTABLE = ("AVX512", "AMX")


def built_in(system_info: str) -> list[str]:
    """The instruction sets ggml reports as compiled in ("AVX2 = 1 | ...")."""
    return re.findall(r"(\w+) = 1", system_info)


def main() -> int:
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode()
    print(f"llama-cpp-python {llama_cpp.__version__}: {info.strip()}")
    native = [name for name in built_in(info) if name.startswith(NOT_PORTABLE)]
    if native:
        print(f"llama-cpp-python was built with {', '.join(native)}: rebuild it with the Makefile's "
              f"LLAMA_CMAKE_ARGS (make install-test)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
