#!/usr/bin/env python3
"""Does NVML work in a process whose libcuda is the omps shim? NVML's init asks libcuda for
export table 69a28e9f, which omps does not provide. Run natively and through omps and
compare: nvmlInit_v2's result, the device count, the first device's name and memory."""
import ctypes

import torch

torch.zeros(1, device="cuda")
torch.cuda.synchronize()
nvml = ctypes.CDLL("libnvidia-ml.so.1")
print("nvmlInit_v2", nvml.nvmlInit_v2())
count = ctypes.c_uint()
print("nvmlDeviceGetCount_v2", nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), count.value)
dev = ctypes.c_void_p()
print("nvmlDeviceGetHandleByIndex_v2", nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)))
name = ctypes.create_string_buffer(96)
print("nvmlDeviceGetName", nvml.nvmlDeviceGetName(dev, name, 96), name.value.decode())


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


mem = Memory()
print("nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(mem)), mem.total)
print("nvmlShutdown", nvml.nvmlShutdown())
