"""This host: its GPUs, mapped to matrix archs by exact compute capability, detected without ever holding a CUDA
context (or importing torch) in the pytest process, and the child-process probe of a mode's allocator."""
