// MultiDeviceStreamParallelTypeTest.Allgather (pr4387): [S, DIDx(D)] -> [Stream(S), D],
// one allgather per row.

!in = !fusion.tensor<[?, 4], f32, mesh = [0, 1, 2, 3], axes = [_, didx]>
!out = !fusion.tensor<[?, 4], f32, mesh = [0, 1, 2, 3], axes = [stream, _]>

func.func @allgather(%in: !in) -> !out {
  %out = fusion.set %in : !in -> !out
  func.return %out : !out
}
