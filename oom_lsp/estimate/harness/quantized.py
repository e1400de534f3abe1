"""Quantized layers the script builds (bitsandbytes' 4/8-bit, and the other quantization
libraries'): their kernels often have no fake implementation, and the run then falls back to real
CPU steps, which run the library's CPU backend; the parent says so, naming the layers, rather
than present a CPU measurement as CUDA's."""

from __future__ import annotations

from torch import nn

# Packages whose layers hold quantized weights with kernels of their own.
QUANTIZATION_PACKAGES = ("bitsandbytes", "optimum.quanto", "torchao", "hqq", "auto_gptq", "gptqmodel", "awq")


def is_quantized_layer(kind: type) -> bool:
    return any(
        kind.__module__ == name or kind.__module__.startswith(name + ".") for name in QUANTIZATION_PACKAGES
    )


def install(shims, state: dict) -> None:
    """Counts the quantized layers registered in a module (`state["quantized_layers"]`)."""
    layers = state["quantized_layers"] = {}

    def registered(module, name, submodule):
        if submodule is not None and is_quantized_layer(type(submodule)):
            label = f"{type(submodule).__module__.split('.')[0]}.{type(submodule).__qualname__}"
            layers[label] = layers.get(label, 0) + 1

    handle = nn.modules.module.register_module_module_registration_hook(registered)
    shims.at_undo(handle.remove)


def library_in(traceback) -> str | None:
    """The quantization package a failure was raised in (bitsandbytes' `Params4bit` cannot wrap a
    fake tensor: the layer fails while it is built, before it is registered), or None."""
    found = None
    while traceback is not None:
        module = traceback.tb_frame.f_globals.get("__name__", "")
        for name in QUANTIZATION_PACKAGES:
            if module == name or module.startswith(name + "."):
                found = name
        traceback = traceback.tb_next
    return found
