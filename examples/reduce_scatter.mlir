// MultiDeviceStreamParallelTypeTest.ReduceScatter (pr4387): [S, DIDx(D), D, M] ->
// sum(1) -> [Stream(S), DIDx(D), M], one reduce-scatter per slice.

!in = !fusion.tensor<[?, 4, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [_, didx, _, _]>
!out = !fusion.tensor<[?, 4, ?], f32, mesh = [0, 1, 2, 3], axes = [stream, didx, _]>

func.func @reduce_scatter(%in: !in) -> !out {
  %out = fusion.sum %in [1] : !in -> !out
  func.return %out : !out
}
