"""The passes on host programs: rewrites of the copy-engine GEMM and reduction pairs
(`reduce-scatter-in-matmul`, `allreduce-in-matmul`), the software pipelining of copy-engine
loops (`copy-engine-pipelining`), fewer slices for the buffers of stream loops
(`per-stream-buffers`), and what buffer liveness decides: where a buffer is freed
(`insert-deallocations`) and which copies and results need no buffer of their own
(`forward-buffers`)."""
