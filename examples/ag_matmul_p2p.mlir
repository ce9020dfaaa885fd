// MultiDeviceStreamParallelTypeTest.AG_matmul_P2p (pr4515): A [DIDx(D), M, K] @ B [K, N]
// -> [Stream(D), M, N]; A is gathered point to point, one device per iteration.

!a = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [didx, _, _]>
!b = !fusion.tensor<[?, ?], f32, mesh = [0, 1, 2, 3]>
!out = !fusion.tensor<[4, ?, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, _, _]>

func.func @ag_matmul_p2p(%a: !a, %b: !b) -> !out {
  %out = fusion.matmul %a, %b : (!a, !b) -> !out
  func.return %out : !out
}
