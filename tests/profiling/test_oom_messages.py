"""The OOM parser over messages copied verbatim from PyTorch issue threads, one per format."""

from __future__ import annotations

import pytest

from oom_lsp.profiling.oom_messages import (
    Frame,
    OomError,
    describe,
    find_ooms,
    is_user_file,
    parse_message,
    parse_size,
)
from oom_lsp.units import format_bytes

GiB = 1024**3
MiB = 1024**2
KiB = 1024


def size(text: str) -> int:
    return parse_size(text)


# torch 1.0-1.3 (pytorch/pytorch#16417): "cached" instead of "reserved".
TORCH_1_0 = (
    "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; "
    "8.57 MiB already allocated; 9.28 GiB free; 4.68 MiB cached)"
)
# torch 1.4-1.9 (pytorch/pytorch#59778).
TORCH_1_8 = (
    "RuntimeError: CUDA out of memory. Tried to allocate 2.26 GiB (GPU 0; 6.00 GiB total capacity; "
    "781.59 MiB already allocated; 3.03 GiB free; 1.24 GiB reserved in total by PyTorch)"
)
# torch 1.13/2.0: torch.cuda.OutOfMemoryError with the max_split_size_mb hint (YingqianWang/iPASSR#9).
TORCH_2_0 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 10.73 GiB (GPU 0; 8.00 GiB total "
    "capacity; 17.20 GiB already allocated; 0 bytes free; 19.15 GiB reserved in total by PyTorch) If "
    "reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See "
    "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
# torch 2.1: the "capacty" typo, another process's usage (Synthintel0/MyGirlGPT#11 shape, kerrj/lerf#73).
TORCH_2_1 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacty "
    "of 23.65 GiB of which 1.66 GiB is free. Including non-PyTorch memory, this process has 20.81 GiB memory "
    "in use. Of the allocated memory 12.09 GiB is allocated by PyTorch, and 4.84 GiB is reserved by PyTorch "
    "but unallocated. If reserved but unallocated memory is large try setting max_split_size_mb to avoid "
    "fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF"
)
# torch 2.2+ with the expandable_segments hint (pytorch/pytorch#16417, comment of 2024-03-13).
TORCH_2_2 = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total "
    "capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has "
    "23.60 GiB memory in use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is "
    "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
# torch 2.x, another process on the GPU (the format quoted in issue 5).
TORCH_2_OTHER_PROCESS = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "23.65 GiB of which 1.06 GiB is free. Process 12345 has 22.58 GiB memory in use. Of the allocated memory "
    "21.80 GiB is allocated by PyTorch, and 344.56 MiB is reserved by PyTorch but unallocated. If reserved "
    "but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
    "fragmentation."
)
# ROCm, torch 2.4+ (kyuz0/amd-strix-halo-image-video-toolboxes#3).
HIP = (
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 3.31 GiB. GPU 0 has a total capacity of "
    "128.00 GiB of which 780.24 MiB is free. Of the allocated memory 57.70 GiB is allocated by PyTorch, and "
    "75.82 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
    "setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
    "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
# ROCm with a memory fraction and private pools (ROCm/TheRock#2118).
HIP_FRACTION = (
    "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
    "287.98 GiB of which 275.86 GiB is free. 1.05 GiB allowed; Of the allocated memory 1017.01 MiB is "
    "allocated by PyTorch, with 17.00 MiB allocated in private pools (e.g., HIP Graphs), and 54.99 MiB is "
    "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
# MPS (lllyasviel/Fooocus#1139), KB/MB/GB in the allocator's binary units.
MPS = (
    "RuntimeError: MPS backend out of memory (MPS allocated: 8.89 GB, other allocations: 172.98 MB, max "
    "allowed: 9.07 GB). Tried to allocate 6.25 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 "
    "to disable upper limit for memory allocations (may cause system failure)."
)
# CPU, old and new wording (pytorch/pytorch#20618, mxfold/mxfold2#20, Comfy-Org/Nvidia_RTX_Nodes_ComfyUI#13).
CPU_CANT = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate memory: "
    "you tried to allocate 132426121216 bytes. Error code 12 (Cannot allocate memory)"
)
CPU_NOT_ENOUGH = (
    "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: you "
    "tried to allocate 31850496000 bytes."
)


def parse_line(line: str) -> OomError:
    found = find_ooms(line)
    assert len(found) == 1, found
    return found[0]


def test_sizes_are_binary_units():
    assert parse_size("20.00 MiB") == 20 * MiB
    assert parse_size("0 bytes") == 0
    assert parse_size("1.5 GiB") == 3 * GiB // 2
    assert parse_size("384.00 KB") == 384 * KiB
    with pytest.raises(ValueError):
        parse_size("12 parsecs")
    assert format_bytes(20 * MiB) == "20.00 MiB"
    assert format_bytes(-512) == "-512 bytes"


def test_torch_1_0_cached():
    oom = parse_line(TORCH_1_0)
    assert (oom.backend, oom.device, oom.exception_type) == ("cuda", "cuda:0", "RuntimeError")
    assert oom.tried_to_allocate == size("12.50 MiB")
    assert oom.total_capacity == size("10.92 GiB")
    assert oom.allocated == size("8.57 MiB")
    assert oom.free == size("9.28 GiB")
    assert oom.reserved == size("4.68 MiB")
    assert oom.hint is None


def test_torch_1_x_reserved_in_total():
    oom = parse_line(TORCH_1_8)
    assert oom.tried_to_allocate == size("2.26 GiB")
    assert oom.total_capacity == size("6.00 GiB")
    assert oom.allocated == size("781.59 MiB")
    assert oom.free == size("3.03 GiB")
    assert oom.reserved == size("1.24 GiB")
    assert oom.reserved_unallocated == size("1.24 GiB") - size("781.59 MiB")


def test_torch_2_0_max_split_hint():
    oom = parse_line(TORCH_2_0)
    assert oom.exception_type == "torch.cuda.OutOfMemoryError"
    assert oom.free == 0
    assert oom.reserved == size("19.15 GiB")
    assert oom.hint_setting == "max_split_size_mb"
    assert oom.hint.startswith("If reserved memory is >> allocated memory try setting max_split_size_mb")


def test_torch_2_1_capacty_typo_and_this_process():
    oom = parse_line(TORCH_2_1)
    assert oom.device == "cuda:0"
    assert oom.tried_to_allocate == 3 * GiB
    assert oom.total_capacity == size("23.65 GiB")
    assert oom.free == size("1.66 GiB")
    assert oom.allocated == size("12.09 GiB")
    assert oom.reserved_unallocated == size("4.84 GiB")
    assert oom.reserved == size("12.09 GiB") + size("4.84 GiB")
    assert [(p.pid, p.bytes) for p in oom.processes] == [(None, size("20.81 GiB"))]
    assert oom.hint_setting == "max_split_size_mb"


def test_torch_2_2_expandable_segments_hint():
    oom = parse_line(TORCH_2_2)
    assert oom.tried_to_allocate == 22 * MiB
    assert oom.free == size("11.06 MiB")
    assert oom.hint_setting == "expandable_segments"
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in oom.hint


def test_torch_2_other_process():
    oom = parse_line(TORCH_2_OTHER_PROCESS)
    assert oom.exception_type == "torch.OutOfMemoryError"
    assert [(p.pid, p.bytes) for p in oom.processes] == [(12345, size("22.58 GiB"))]
    assert oom.allocated == size("21.80 GiB")
    assert oom.reserved_unallocated == size("344.56 MiB")


def test_hip():
    oom = parse_line(HIP)
    assert (oom.backend, oom.device) == ("hip", "hip:0")
    assert oom.total_capacity == 128 * GiB
    assert oom.free == size("780.24 MiB")
    assert oom.hint_setting == "expandable_segments"
    assert "PYTORCH_HIP_ALLOC_CONF" in oom.hint


def test_hip_memory_fraction_and_private_pools():
    oom = parse_line(HIP_FRACTION)
    assert oom.allowed == size("1.05 GiB")
    assert oom.private_pools == 17 * MiB
    assert oom.allocated == size("1017.01 MiB")
    assert oom.reserved_unallocated == size("54.99 MiB")


def test_mps():
    oom = parse_line(MPS)
    assert (oom.backend, oom.device) == ("mps", "mps")
    assert oom.allocated == size("8.89 GB")
    assert oom.other_allocations == size("172.98 MB")
    assert oom.allowed == size("9.07 GB")
    assert oom.tried_to_allocate == size("6.25 MB")
    assert oom.hint_setting == "mps_high_watermark_ratio"


@pytest.mark.parametrize(("line", "nbytes"), [(CPU_CANT, 132426121216), (CPU_NOT_ENOUGH, 31850496000)])
def test_cpu(line, nbytes):
    oom = parse_line(line)
    assert (oom.backend, oom.device, oom.tried_to_allocate) == ("cpu", "cpu", nbytes)


def test_not_an_oom():
    assert parse_message("RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x3 and 4x5)") is None
    assert find_ooms("all good\nloss 0.31\n") == []


TRACEBACK_LOG = f"""\
epoch 0 step 10 loss 2.31
Traceback (most recent call last):
  File "/home/ana/proj/train.py", line 88, in <module>
    main()
  File "/home/ana/proj/train.py", line 80, in main
    loss = step(model, batch)
           ^^^^^^^^^^^^^^^^^^
  File "/home/ana/proj/model/step.py", line 12, in step
    out = model(x)
  File "/home/ana/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1751, in _wrapped_call_impl
    return self._call_impl(*args, **kwargs)
  File "/usr/lib/python3.11/contextlib.py", line 81, in inner
    return func(*args, **kwds)
{TORCH_2_2}
retrying with batch 16
Traceback (most recent call last):
  File "C:\\\\Users\\\\bo\\\\train.py", line 5, in <module>
    x = torch.zeros(10**12, device="cuda")
{TORCH_1_8}
"""


def test_several_ooms_in_one_log_each_with_its_user_frames():
    first, second = find_ooms(TRACEBACK_LOG)
    assert [f.file for f in first.frames] == ["/home/ana/proj/train.py"] * 2 + ["/home/ana/proj/model/step.py"]
    assert first.failing_frame == Frame("/home/ana/proj/model/step.py", 12, "step", "out = model(x)")
    assert first.frames[1].code == "loss = step(model, batch)"
    assert first.log_line == 14
    assert first.tried_to_allocate == 22 * MiB
    assert second.failing_frame.line == 5
    assert second.failing_frame.code == 'x = torch.zeros(10**12, device="cuda")'
    assert second.tried_to_allocate == size("2.26 GiB")


def test_chained_exception_keeps_the_oom_traceback():
    log = f"""\
Traceback (most recent call last):
  File "/w/run.py", line 3, in <module>
    fit()
  File "/w/run.py", line 2, in fit
    torch.empty(1 << 40, device="cuda")
{TORCH_2_OTHER_PROCESS}

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "/w/run.py", line 5, in <module>
    raise SystemExit(1)
SystemExit: 1
"""
    (oom,) = find_ooms(log)
    assert oom.failing_frame == Frame("/w/run.py", 2, "fit", 'torch.empty(1 << 40, device="cuda")')


def test_message_without_traceback_has_no_frames():
    oom = parse_line("12:00:01 ERROR " + TORCH_2_2.split(": ", 1)[1])
    assert oom.frames == ()
    assert oom.exception_type is None
    assert oom.tried_to_allocate == 22 * MiB


def test_user_file_filter():
    assert is_user_file("/home/a/train.py")
    assert is_user_file("C:\\Users\\a\\train.py")
    assert not is_user_file("/x/.venv/lib/python3.11/site-packages/torch/nn/modules/module.py")
    assert not is_user_file("/usr/lib/python3.11/runpy.py")
    assert not is_user_file("<frozen runpy>")
    assert not is_user_file("C:\\Python311\\Lib\\runpy.py")


def test_round_trip_and_description():
    (oom,) = find_ooms(TRACEBACK_LOG)[:1]
    assert OomError.from_dict(oom.to_dict()) == oom
    rows = dict(describe(oom))
    assert rows["tried to allocate"] == "22.00 MiB"
    assert rows["free"] == "11.06 MiB"
    assert rows["failed at"] == "/home/ana/proj/model/step.py:12 in step: out = model(x)"
