"""Pretrained checkpoints without reading them, and no network.

Under fake mode, a safetensors file is opened by its header alone: the 8-byte length and the JSON
after it give every tensor's name, dtype and shape, and a tensor asked for is a fake tensor of that
shape and dtype (allocated as a real load allocates it, so the tracker counts it the same). Not a
byte of tensor data is read. `safetensors.safe_open` is replaced, where safetensors and every module
already imported hold it, so that what loads through it works unchanged: Transformers'
`from_pretrained` (sharded index, `dtype="auto"` from the header or the config, tied weights, missing
and unexpected keys, its renamings), and `safetensors.torch.load_file` (PEFT adapters, diffusers).
`.bin` checkpoints need nothing here: `torch.load` under fake mode makes meta storages and reads no
tensor data. The run's loads are synchronous (`HF_DEACTIVATE_ASYNC_LOAD`), so that the trace sees
them in order, in the thread its modes are active in.

Under fake mode, saving writes no tensor data, as `torch.save` does nothing: safetensors'
`save_file` and `save_model` write nothing, and `save` gives the header alone (Transformers'
`save_pretrained` and PEFT's, diffusers', sentence-transformers' savers end there; they still write
their small JSON files). The real functions would read fake data pointers (a crash). They are
replaced wherever they are bound, under any name (`save_file as safe_save_file`), and call the
real ones when no fake run is on.

Every run, fake or real, is offline (`HF_HUB_OFFLINE=1`): a Hub name resolves to its copy in the
Hugging Face cache or fails, and `missing_download` turns that failure into one line that says what
is needed.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import traceback

import torch

# safetensors refuses headers above 100 MB; so does this.
HEADER_LIMIT = 100_000_000

_DTYPES = {
    name: getattr(torch, attribute)
    for name, attribute in (
        ("BOOL", "bool"),
        ("U8", "uint8"),
        ("I8", "int8"),
        ("U16", "uint16"),
        ("I16", "int16"),
        ("F16", "float16"),
        ("BF16", "bfloat16"),
        ("U32", "uint32"),
        ("I32", "int32"),
        ("F32", "float32"),
        ("C64", "complex64"),
        ("U64", "uint64"),
        ("I64", "int64"),
        ("F64", "float64"),
        ("F8_E4M3", "float8_e4m3fn"),
        ("F8_E5M2", "float8_e5m2"),
        ("F8_E8M0", "float8_e8m0fnu"),
    )
    if hasattr(torch, attribute)
}

# The run's fake mode while a fake run is on: a `safe_open` bound by a module imported during an
# earlier run of this interpreter (a batch-size search runs the script several times) stays bound
# to HeaderOnlyFile, which opens files for real when no fake run is on.
_ACTIVE: dict = {"fake_mode": None, "real_open": None}
_SAVERS = ("save_file", "save", "save_model")


def install(shims, state: dict) -> None:
    _offline(shims)
    fake_mode = state.get("fake_mode")
    if fake_mode is None:
        return
    _set_environment(shims, "HF_DEACTIVATE_ASYNC_LOAD", "1")
    try:
        import safetensors
        import safetensors.torch  # binds safe_open too: patched below with the rest
    except ImportError:
        return
    real_open = safetensors.safe_open if safetensors.safe_open is not HeaderOnlyFile else _ACTIVE["real_open"]
    _ACTIVE.update(fake_mode=fake_mode, real_open=real_open)
    shims.at_undo(lambda: _ACTIVE.update(fake_mode=None))
    for module in list(sys.modules.values()):
        # The module's own namespace, never its __getattr__ (lazy modules import on a miss).
        if getattr(module, "__dict__", {}).get("safe_open") is real_open:
            shims.patch(module, "safe_open", HeaderOnlyFile)
    _install_savers(shims, safetensors.torch)


def _install_savers(shims, module) -> None:
    """safetensors' savers write no data under fake mode (the module's docstring)."""
    for name in _SAVERS:
        if hasattr(module, name):
            shims.patch_everywhere(module, name, _fake_saver(name))


def _fake_saver(name: str):
    def saver(tensors, *args, **kwargs):
        if name == "save":
            return _header_bytes(tensors, kwargs.get("metadata", args[0] if args else None))
        return None

    return saver


def _header_bytes(tensors: dict, metadata: dict | None) -> bytes:
    """A safetensors header for `tensors` (names, dtypes, shapes, offsets), without their data."""
    names = {dtype: name for name, dtype in _DTYPES.items()}
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, tensor in tensors.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {
            "dtype": names[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(text)) + text


def _offline(shims) -> None:
    _set_environment(shims, "HF_HUB_OFFLINE", "1")
    # Read once, when huggingface_hub is imported: already imported in an interpreter that ran
    # the script before.
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None and hasattr(constants, "HF_HUB_OFFLINE"):
        shims.patch(constants, "HF_HUB_OFFLINE", True)


def _set_environment(shims, name: str, value: str) -> None:
    previous = os.environ.get(name)
    os.environ[name] = value

    def restore():
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous

    shims.at_undo(restore)


def read_header(path: str) -> tuple[dict, dict | None]:
    """The tensors of a safetensors file ({name: {"dtype", "shape", "data_offsets"}}) and its
    `__metadata__`, from the header alone."""
    from safetensors import SafetensorError

    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise SafetensorError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (size,) = struct.unpack("<Q", prefix)
        if size > HEADER_LIMIT:
            raise SafetensorError(f"{path}: not a safetensors file (a header of {size} bytes)")
        text = handle.read(size)
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, ValueError) as error:
        raise SafetensorError(f"{path}: not a safetensors file (its header is not JSON: {error})") from None
    if not isinstance(header, dict):
        raise SafetensorError(f"{path}: not a safetensors file (its header is not a JSON object)")
    metadata = header.pop("__metadata__", None)
    for name, entry in header.items():
        if not isinstance(entry, dict) or entry.get("dtype") not in _DTYPES or "shape" not in entry:
            raise SafetensorError(f"{path}: tensor {name!r} has no shape or a dtype torch lacks: {entry!r}")
    return header, metadata


class HeaderOnlyFile:
    """`safetensors.safe_open` under fake mode: the file's header, tensors as fake tensors."""

    def __new__(cls, filename, framework, device="cpu", **kwargs):
        if _ACTIVE["fake_mode"] is None or framework not in ("pt", "torch"):
            return _ACTIVE["real_open"](filename, framework, device=device, **kwargs)
        return super().__new__(cls)

    def __init__(self, filename, framework, device="cpu", **kwargs):
        self.filename = os.fspath(filename)
        self.device = device
        self.fake_mode = _ACTIVE["fake_mode"]
        self._tensors, self._metadata = read_header(self.filename)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return None

    def keys(self) -> list[str]:
        return sorted(self._tensors)

    def offset_keys(self) -> list[str]:
        return sorted(self._tensors, key=lambda name: self._tensors[name].get("data_offsets", [0])[0])

    def metadata(self) -> dict | None:
        return self._metadata

    def get_slice(self, name: str) -> HeaderOnlySlice:
        entry = self._tensors.get(name)
        if entry is None:
            from safetensors import SafetensorError

            raise SafetensorError(f"File does not contain tensor {name}")
        return HeaderOnlySlice(self, entry)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self.get_slice(name)[...]

    def get_tensors(self) -> dict[str, torch.Tensor]:
        return {name: self.get_tensor(name) for name in self.offset_keys()}


class HeaderOnlySlice:
    """`safe_open(...).get_slice(name)`: shape and dtype from the header; indexing it makes the tensor."""

    def __init__(self, file: HeaderOnlyFile, entry: dict):
        self.file = file
        self.entry = entry

    def get_shape(self) -> list[int]:
        return list(self.entry["shape"])

    def get_dtype(self) -> str:
        return self.entry["dtype"]

    def __getitem__(self, index) -> torch.Tensor:
        tensor = _fake_empty(
            self.file.fake_mode, self.get_shape(), _DTYPES[self.get_dtype()], self.file.device
        )
        if index is Ellipsis or index == (Ellipsis,):
            return tensor
        # A part of the tensor is a tensor of its own, as safetensors reads only that part.
        return tensor[index].clone()


def _fake_empty(fake_mode, shape: list[int], dtype: torch.dtype, device) -> torch.Tensor:
    """A fake tensor where a real load puts the tensor it reads."""
    from torch._subclasses.fake_tensor import FakeTensor

    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is fake_mode:
        # Through the run's modes: the tracker counts it, a CUDA device is redirected and marked.
        return torch.empty(shape, dtype=dtype, device=device)
    # Another thread, where no mode is active: built directly, no dispatch.
    return FakeTensor(fake_mode, torch.empty(shape, dtype=dtype, device="meta"), torch.device("cpu"))


def missing_download(error: BaseException) -> str | None:
    """One line for a Hub name with no local copy (the run is offline), None for other failures."""
    seen = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if type(current).__name__ in ("LocalEntryNotFoundError", "OfflineModeIsEnabled"):
            name = _repo_id(current)
            shown = f"{name!r}" if name else "a Hub name"
            command = f"`hf download {name}`" if name else "`hf download NAME`"
            return (
                f"{shown} is neither a local folder nor in the Hugging Face cache, and the estimate never "
                f"downloads (it runs with HF_HUB_OFFLINE=1): download it once with {command} "
                "(`huggingface-cli download` before huggingface_hub 1.0), or pass a local folder"
            )
        current = current.__cause__ or current.__context__
    return None


def _repo_id(error: BaseException) -> str | None:
    """The repository huggingface_hub was asked for: its download function's `repo_id`."""
    found = None
    for frame, _ in traceback.walk_tb(error.__traceback__):
        if frame.f_globals.get("__name__", "").startswith("huggingface_hub"):
            value = frame.f_locals.get("repo_id")
            if isinstance(value, str):
                found = value
    return found
