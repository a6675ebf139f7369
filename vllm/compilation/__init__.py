"""Compilation and CUDA graphs (upstream: vllm/compilation/).

`cuda_graph.CUDAGraphWrapper` captures and replays whole-model CUDA graphs
(FULL runtime mode). Piecewise graphs need the Inductor graph split, which
this build does not have (see vllm/config/compilation.py).
"""
