// MultiDeviceStreamParallelTypeTest.matmul_AR (pr4387): a matmul sharded along K, then
// the allreduce of its partial sums, chunk by chunk.
// A [S, DIDx(D), M, K/D] @ B [DIDx(D), K/D, N] -> [Stream(S), DIDx(D), M, N] -> sum(1)
// -> [Stream(S), M, N].

!a = !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>
!b = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
!partial = !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, didx, _, _]>
!out = !fusion.tensor<[?, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>

func.func @matmul_ar(%a: !a, %b: !b) -> !out {
  %partial = fusion.matmul %a, %b : (!a, !b) -> !partial
  %out = fusion.sum %partial [1] : !partial -> !out
  func.return %out : !out
}
