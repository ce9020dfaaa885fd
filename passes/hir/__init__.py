"""The passes on host programs: rewrites of the copy-engine GEMM and reduction pairs
(`reduce-scatter-in-matmul`, `allreduce-in-matmul`), the software pipelining of copy-engine
loops (`copy-engine-pipelining`), fewer slices for the buffers of stream loops
(`per-stream-buffers`), and buffer liveness (`insert-deallocations`)."""
