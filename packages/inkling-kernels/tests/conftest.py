"""Run the Triton kernels under the interpreter on machines without a GPU.

TRITON_INTERPRET must be set before triton (or any kernel module) is imported, so
it is set here, at collection time. On a CUDA machine the kernels are compiled.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
