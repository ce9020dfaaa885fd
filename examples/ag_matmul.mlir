// MultiDeviceStreamParallelTypeTest.AG_matmul (pr4387): A [S, DIDx(D), M, K] @ B [K, N]
// -> [Stream(S), D, M, N]; each chunk of A is allgathered, then multiplied.

!a = !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3]>
!out = !fusion.tensor<[?, 4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _, _]>

func.func @ag_matmul(%a: !a, %b: !b) -> !out {
  %out = fusion.matmul %a, %b : (!a, !b) -> !out
  func.return %out : !out
}
