"""Model Runner V2 (upstream: vllm/v1/worker/gpu/).

One permanent row per request (`states.py: RequestState`) instead of V1's
persistent batch that is condensed as requests leave: each step gathers its
batch through `idx_mapping` (row of each scheduled request), block tables
live on the device (`block_table.py`), inputs are prepared on the device
(`input_batch.py`, Triton kernels in `input_batch_kernels.py`, a torch path
on CPU), and sampling (`sample/`) is Gumbel-max with a stateless stream per
(seed, position), so a seeded request's tokens do not depend on its
batch-mates. Full CUDA graphs: `cudagraph_utils.py: CudaGraphManager`;
pipeline parallelism: `pp_utils.py`.
"""
